//! What `autocomp new` writes and says, filled in from the templates: the generated files'
//! texts (`Texts`) and the next steps of a Python or shell step (`ScriptNext`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::templates::*;
use super::{DEFAULT_REQUIRES, Lang};

/// What the output and the README of a Python or shell step say.
#[derive(Debug)]
pub(super) struct ScriptNext {
    pub(super) lang: Lang,
    /// The file name stem: `NAME` ('-' as '_' for Python, an importable module name).
    pub(super) stem: String,
    pub(super) event_type: String,
    /// The required types, comma-separated, for `--requires`.
    pub(super) requires: String,
    /// `contrib/python` of the sources this autocomp was built from, when it is still there.
    pub(super) python_path: Option<String>,
}

impl ScriptNext {
    pub(super) fn file(&self, dir: &Path) -> PathBuf {
        dir.join(match self.lang {
            Lang::Python => format!("{}.py", self.stem),
            _ => format!("{}.sh", self.stem),
        })
    }

    /// `PYTHONPATH=... ` when the module is not installed (the sources' contrib/python).
    pub(super) fn env(&self) -> String {
        match (&self.python_path, self.lang) {
            (Some(path), Lang::Python) => format!("PYTHONPATH={path} "),
            _ => String::new(),
        }
    }

    /// The step's contract on the command line: the result schema it publishes and, per
    /// required type, what it reads of that result.
    fn contract_flags(&self, dir: &Path) -> String {
        let mut flags = format!(" --result-schema {}", dir.join(format!("{}.result.json", self.stem)).display());
        for read in self.requires.split(',') {
            write!(flags, " --reads {read}={}", dir.join(format!("{}.reads.{read}.json", self.stem)).display()).ok();
        }
        flags
    }

    pub(super) fn exec(&self, name: &str, dir: &Path, extra: &str) -> String {
        let interpreter = if self.lang == Lang::Python { "python3" } else { "sh" };
        format!(
            "{}autocomp-exec --name {name} --event-type {} --requires {}{}{extra} -- {interpreter} {}",
            self.env(),
            self.event_type,
            self.requires,
            self.contract_flags(dir),
            self.file(dir).display()
        )
    }

    pub(super) fn test(&self, dir: &Path) -> String {
        match self.lang {
            Lang::Python => format!("cd {} && {}python3 -m unittest test_{}", dir.display(), self.env(), self.stem),
            _ => format!("cd {} && sh test_{}.sh", dir.display(), self.stem),
        }
    }
}

/// Where the autocomp_step module is in the sources this autocomp was built from.
pub(super) fn python_path() -> Option<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).with_file_name("contrib").join("python");
    path.join("autocomp_step/__init__.py").is_file().then(|| path.to_str().map(str::to_owned)).flatten()
}

/// The layout of the workspace's `rustfmt.toml`, for a crate written outside it.
pub(super) const RUSTFMT_TOML: &str = "max_width = 120\nuse_small_heuristics = \"Max\"\n";

/// The generated files' texts.
pub(super) struct Texts<'a> {
    pub(super) name: &'a str,
    pub(super) event_type: &'a str,
    pub(super) requires: &'a [String],
}

impl Texts<'_> {
    /// The component's type name: the crate name in upper camel case, unless that would
    /// shadow a name `main.rs` uses.
    pub(super) fn type_name(&self) -> String {
        let camel: String = self
            .name
            .split(['-', '_'])
            .filter(|part| !part.is_empty())
            .map(|part| {
                let mut chars = part.chars();
                chars.next().map(|c| c.to_ascii_uppercase()).into_iter().chain(chars).collect::<String>()
            })
            .collect();
        const USED: &str = "Settings Counted Component Batch Trigger WorkContext WorkError IoResultExt Outcome \
            Serialize Deserialize Default Debug PartialEq Result Ok Err Option Some None Vec String Box Iterator Fn \
            Send Sync Sized Copy Clone";
        if USED.split_whitespace().any(|word| word == camel) { format!("{camel}Component") } else { camel }
    }

    /// The `Trigger::builder()` chain, laid out as rustfmt (at the workspace's width) would:
    /// on one line when it fits, else one call a line.
    fn trigger(&self) -> String {
        let quoted: Vec<String> = self.requires.iter().map(|t| format!("\"{t}\"")).collect();
        let list = format!("[{}]", quoted.join(", "));
        let own = format!("\"{}\"", self.event_type);
        let line = format!("        Trigger::builder().requires({list}).blocked_by({own}).build()");
        if line.len() <= 120 {
            return line;
        }
        let mut chain = String::from("        Trigger::builder()\n");
        if 12 + ".requires()".len() + list.len() <= 120 {
            writeln!(chain, "            .requires({list})").ok();
        } else {
            for required in &quoted {
                writeln!(chain, "            .requires({required})").ok();
            }
        }
        write!(chain, "            .blocked_by({own})\n            .build()").ok();
        chain
    }

    pub(super) fn main_rs(&self) -> String {
        MAIN_RS
            .replace("@NAME@", self.name)
            .replace("@TYPE@", self.event_type)
            .replace("@STRUCT@", &self.type_name())
            .replace("@TRIGGER@", &self.trigger())
    }

    pub(super) fn tests_rs(&self) -> String {
        TESTS_RS.replace("@STRUCT@", &self.type_name())
    }

    pub(super) fn config_toml(&self) -> String {
        let requires: Vec<String> = self.requires.iter().map(|t| format!("\"{t}\"")).collect();
        CONFIG_TOML
            .replace("@NAME@", self.name)
            .replace("@TYPE@", self.event_type)
            .replace("@REQUIRES@", &requires.join(", "))
    }

    fn description(&self) -> String {
        format!("Autonomous component: records {} with the number of files in the batch's directory.", self.event_type)
    }

    pub(super) fn cargo_toml_in_workspace(&self) -> String {
        CARGO_TOML_IN_WORKSPACE.replace("@NAME@", self.name).replace("@DESCRIPTION@", &self.description())
    }

    /// The required types as a Python list or TOML array: `"A", "B"`.
    fn quoted_requires(&self) -> String {
        let quoted: Vec<String> = self.requires.iter().map(|t| format!("\"{t}\"")).collect();
        quoted.join(", ")
    }

    fn first_required(&self) -> &str {
        self.requires.first().map_or(DEFAULT_REQUIRES, String::as_str)
    }

    fn script(&self, template: &str, stem: &str) -> String {
        template
            .replace("@NAME@", self.name)
            .replace("@TYPE@", self.event_type)
            .replace("@REQUIRES@", &self.quoted_requires())
            .replace("@REQUIRES_WORDS@", &self.requires.join(" "))
            .replace("@FIRST@", self.first_required())
            .replace("@STEM@", stem)
    }

    pub(super) fn python_step(&self) -> String {
        self.script(PYTHON_STEP, "")
    }

    pub(super) fn python_test(&self, stem: &str) -> String {
        self.script(PYTHON_TEST, stem)
    }

    pub(super) fn shell_step(&self) -> String {
        self.script(SHELL_STEP, "")
    }

    pub(super) fn shell_test(&self, stem: &str) -> String {
        self.script(SHELL_TEST, stem)
    }

    pub(super) fn script_config_toml(&self) -> String {
        self.script(SCRIPT_CONFIG_TOML, "")
    }

    /// The schema of the step's result (`STEM.result.json`).
    pub(super) fn result_schema(&self) -> String {
        self.script(RESULT_SCHEMA, "")
    }

    /// Per required type, `(STEM.reads.TYPE.json, what the step expects of its result)`.
    pub(super) fn reads_schemas(&self, stem: &str) -> Vec<(String, String)> {
        let file = |read: &String| format!("{stem}.reads.{read}.json");
        self.requires.iter().map(|read| (file(read), self.script(READS_SCHEMA, stem).replace("@READ@", read))).collect()
    }

    pub(super) fn script_readme(&self, script: &ScriptNext, dir: &Path) -> String {
        let what = if script.lang == Lang::Python { "Python" } else { "shell" };
        let docs = if script.lang == Lang::Python { "docs/python-steps.md" } else { "docs/command-protocol.md" };
        format!(
            "# {name}\n\n\
             A {what} step for `autocomp-exec`: records `{event_type}` with the number of files in the batch's \
             directory, after `{requires}` (whose results it reads). Written by `autocomp new`; the guide is \
             {docs} in the autocomp repository.\n\n\
             Its contract: the schema of the result it records, `{stem}.result.json` (published in the component \
             registry with `--result-schema`; autocomp-exec refuses a result that does not fit it), and per step it \
             reads, what it expects of that step's result, `{stem}.reads.TYPE.json` (`--reads TYPE=FILE`: name the \
             fields it reads there; once their producer stops publishing one, its passes stop before any work and \
             `autocomp explain`, `alerts` and the monitor say so).\n\n\
             Its tests, without autocomp:\n\n    {test}\n\n\
             Copy `{name}.toml` into the config dir (the one holding autocomp.toml, /etc/autocomp by default), \
             then one pass:\n\n    {exec}\n\n\
             Under cron (`crontab -e`; stderr appended to a log, stdout mailed: one line per batch):\n\n    \
             */10 * * * *  {exec} 2>>/var/log/autocomp/{name}.log\n",
            name = self.name,
            event_type = self.event_type,
            requires = self.requires.join("`, `"),
            test = script.test(dir),
            stem = script.stem,
            exec = script.exec(self.name, dir, ""),
        )
    }

    pub(super) fn cargo_toml_standalone(&self, framework: &str) -> String {
        let framework = toml::Value::String(framework.to_owned()).to_string();
        CARGO_TOML_STANDALONE
            .replace("@NAME@", self.name)
            .replace("@DESCRIPTION@", &self.description())
            .replace("@FRAMEWORK@", &framework)
    }
}
