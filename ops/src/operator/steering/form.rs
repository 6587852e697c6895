//! A [`SteerAction`] as a form posts it: the monitor's steering forms post these fields, so
//! `SteerAction` deserializes from them (and serializes to them) with the checks and the
//! words the monitor has always used. Apart from the steering actions because it is about
//! the fields of a form, not about what steering does.

use autocomp_model::{InvalidInput, MAX_POOL_SIZE};
use serde::{Deserialize, Serialize};

use super::{Scope, SteerAction};
use crate::operator::actions::checkbox;

/// The fields of a steering form, each as posted (text): `action` (`pause`, `drain`,
/// `resume`, `resume-rerun-failed`, `pool`); the scope of the first four, `component` or
/// the checkbox `all` (`1`); a pool size's `pool` and `size` (0 to
/// [`MAX_POOL_SIZE`]). Other fields (`reason`, `confirm`, `version`, ...) are ignored here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SteerForm {
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
}

impl SteerForm {
    /// A field given and not blank, trimmed.
    fn given(value: &Option<String>) -> Option<&str> {
        value.as_deref().map(str::trim).filter(|v| !v.is_empty())
    }

    fn scope(&self, all: bool) -> Result<Scope, InvalidInput> {
        match (all, SteerForm::given(&self.component)) {
            (true, Some(name)) => Err(InvalidInput::new(
                "all",
                "1",
                format!("either the whole pipeline or one component ({name}), not both"),
            )),
            (true, None) => Ok(Scope::All),
            (false, Some(name)) => Ok(Scope::Component(name.to_owned())),
            (false, None) => Err(InvalidInput::new(
                "component",
                "",
                "required: the component to steer (or all=1 for the whole pipeline)",
            )),
        }
    }

    fn hold(&self, text: &str, all: bool) -> Result<SteerAction, InvalidInput> {
        for (name, value) in [("pool", &self.pool), ("size", &self.size)] {
            if let Some(value) = SteerForm::given(value) {
                return Err(InvalidInput::new(name, value, format!("only a pool size takes it, not a {text}")));
            }
        }
        let scope = self.scope(all)?;
        Ok(match text {
            "pause" => SteerAction::Pause { scope },
            "drain" => SteerAction::Drain { scope },
            "resume" => SteerAction::Resume { scope, rerun_failed: false },
            _ if scope == Scope::All => {
                return Err(InvalidInput::new(
                    "action",
                    text,
                    "rerunning the failed batches is for one component's open circuit; the whole pipeline resumes \
                     with resume",
                ));
            }
            _ => SteerAction::Resume { scope, rerun_failed: true },
        })
    }

    fn pool_size(&self, all: bool) -> Result<SteerAction, InvalidInput> {
        if all {
            return Err(InvalidInput::new("all", "1", "a pool size names a pool, not the pipeline"));
        }
        if let Some(name) = SteerForm::given(&self.component) {
            return Err(InvalidInput::new("component", name, "a pool size names a pool, not a component"));
        }
        let pool =
            SteerForm::given(&self.pool).ok_or_else(|| InvalidInput::new("pool", "", "required: the pool's name"))?;
        let size = self.size.as_deref().unwrap_or_default();
        let parsed = size.trim().parse::<u32>().ok().filter(|n| *n <= MAX_POOL_SIZE);
        let size = parsed.ok_or_else(|| {
            InvalidInput::new(
                "size",
                size,
                format!("expected a whole number from 0 to {MAX_POOL_SIZE} (0 closes the pool)"),
            )
        })?;
        Ok(SteerAction::SetPool { pool: pool.to_owned(), size })
    }
}

impl TryFrom<SteerForm> for SteerAction {
    type Error = InvalidInput;

    fn try_from(form: SteerForm) -> Result<SteerAction, InvalidInput> {
        let text = form.action.as_str();
        let all = checkbox("all", form.all.as_deref())?;
        match text {
            "pause" | "drain" | "resume" | "resume-rerun-failed" => form.hold(text, all),
            "pool" => form.pool_size(all),
            other => {
                Err(InvalidInput::new("action", other, "expected pause, drain, resume, resume-rerun-failed or pool"))
            }
        }
    }
}

impl From<SteerAction> for SteerForm {
    fn from(action: SteerAction) -> SteerForm {
        let scoped = |action: &str, scope: Scope| {
            let (component, all) = match scope {
                Scope::All => (None, Some("1".to_owned())),
                Scope::Component(name) => (Some(name), None),
            };
            SteerForm { action: action.to_owned(), component, all, pool: None, size: None }
        };
        match action {
            SteerAction::Pause { scope } => scoped("pause", scope),
            SteerAction::Drain { scope } => scoped("drain", scope),
            SteerAction::Resume { scope, rerun_failed: false } => scoped("resume", scope),
            SteerAction::Resume { scope, rerun_failed: true } => scoped("resume-rerun-failed", scope),
            SteerAction::SetPool { pool, size } => SteerForm {
                action: "pool".to_owned(),
                pool: Some(pool),
                size: Some(size.to_string()),
                ..SteerForm::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(fields: &str) -> Result<SteerAction, String> {
        serde_json::from_str::<SteerAction>(fields).map_err(|e| e.to_string())
    }

    #[test]
    fn each_steering_action_reads_from_the_monitors_fields_and_writes_back_to_them() {
        let cases = [
            (r#"{"action":"pause","all":"1"}"#, SteerAction::Pause { scope: Scope::All }),
            (r#"{"action":"drain","component":" a "}"#, SteerAction::Drain { scope: Scope::Component("a".into()) }),
            (
                r#"{"action":"resume","component":"a","reason":"ignored"}"#,
                SteerAction::Resume { scope: Scope::Component("a".into()), rerun_failed: false },
            ),
            (
                r#"{"action":"resume-rerun-failed","component":"a"}"#,
                SteerAction::Resume { scope: Scope::Component("a".into()), rerun_failed: true },
            ),
            (r#"{"action":"pool","pool":"tape","size":"3"}"#, SteerAction::SetPool { pool: "tape".into(), size: 3 }),
        ];
        for (fields, action) in cases {
            assert_eq!(form(fields), Ok(action.clone()), "{fields}");
            let back = serde_json::to_string(&action).unwrap();
            assert_eq!(form(&back), Ok(action));
        }
        assert_eq!(
            serde_json::to_string(&SteerAction::Pause { scope: Scope::All }).unwrap(),
            r#"{"action":"pause","all":"1"}"#
        );
    }

    #[test]
    fn wrong_fields_are_refused_in_the_monitors_words() {
        let refused = [
            (r#"{"action":"stop","all":"1"}"#, "expected pause, drain, resume, resume-rerun-failed or pool"),
            (r#"{"action":"pause","all":"1","component":"a"}"#, "either the whole pipeline or one component (a)"),
            (r#"{"action":"pause"}"#, "required: the component to steer"),
            (r#"{"action":"pause","all":"1","size":"3"}"#, "only a pool size takes it, not a pause"),
            (r#"{"action":"resume-rerun-failed","all":"1"}"#, "the whole pipeline resumes with resume"),
            (r#"{"action":"pool","all":"1","pool":"t","size":"1"}"#, "a pool size names a pool, not the pipeline"),
            (r#"{"action":"pool","pool":"t","size":"1001"}"#, "expected a whole number from 0 to 1000"),
            (r#"{"action":"pool","size":"1"}"#, "required: the pool's name"),
            (r#"{"action":"pause","all":"on"}"#, "expected 1 (checked) or nothing"),
        ];
        for (fields, words) in refused {
            let error = form(fields).unwrap_err();
            assert!(error.contains(words), "{fields}: {error}");
        }
    }
}
