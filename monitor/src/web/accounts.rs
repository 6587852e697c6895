//! The monitor's accounts: the users file (`name role argon2-hash` a line), the roles, how a
//! name is checked (NFC, no control or bidi characters, any script), the password rules and
//! the argon2 hashing, and the reloadable set a running monitor reads on every request.
//!
//! A session remembers the hash it was opened with, so a changed password or a removed
//! account ends that account's sessions at the next reload of the file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use argon2::password_hash::rand_core::{OsRng, RngCore};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params};
use autocomp_model::InvalidInput;
use autocomp_toolkit::reload::Reloaded;
use unicode_normalization::UnicodeNormalization;

/// The shortest password accepted (characters): long enough that a stolen hash is not
/// worth guessing at argon2's cost.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// The longest accepted (bytes): bounds the work one sign-in can ask for.
pub const MAX_PASSWORD_BYTES: usize = 1024;
/// The longest account name (characters).
pub const MAX_NAME_CHARS: usize = 64;
/// The hash field of an account that signs in only through the trusted proxy.
pub const PROXY_ONLY: &str = "-";

/// What an account may do; each role may do what the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Reads every page and export.
    Viewer,
    /// Also acts on batches: rerun, restart, cancel, skip, prioritize, one or in bulk, and
    /// approves or rejects a batch waiting at a human step.
    Operator,
    /// Also changes what is pipeline-wide: pause, drain, resume, pools.
    Admin,
}

impl Role {
    pub fn parse(text: &str) -> Result<Role, InvalidInput> {
        match text {
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            other => Err(InvalidInput::new("role", other, "expected viewer, operator or admin")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One person.
#[derive(Clone, PartialEq, Eq)]
pub struct Account {
    /// NFC, checked by [`account_name`].
    pub name: String,
    pub role: Role,
    /// An argon2id PHC string, or [`PROXY_ONLY`].
    pub hash: String,
}

impl fmt::Debug for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The hash stays out of logs and test output.
        f.debug_struct("Account").field("name", &self.name).field("role", &self.role).finish_non_exhaustive()
    }
}

/// A name as an account is known by: NFC-normalized, 1-64 characters of any script, spaces
/// only between words, and none of the characters that hide or reorder text (controls,
/// bidi overrides and isolates, zero-width and other format characters, line separators).
/// The error names the field and the name as given.
pub fn account_name(field: &str, text: &str) -> Result<String, InvalidInput> {
    let name: String = text.nfc().collect();
    let refuse = |reason: String| Err(InvalidInput::new(field, text, reason));
    if let Some(c) = name.chars().find(|c| c.is_control() || invisible(*c)) {
        return refuse(format!(
            "contains U+{:04X}, a control or invisible formatting character (it could disguise the name)",
            c as u32
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_whitespace() && *c != ' ') {
        return refuse(format!("contains U+{:04X}: only plain spaces may separate words", c as u32));
    }
    let count = name.chars().count();
    if count == 0 || count > MAX_NAME_CHARS {
        return refuse(format!("must be 1-{MAX_NAME_CHARS} characters (it has {count})"));
    }
    if name.starts_with(' ') || name.ends_with(' ') || name.contains("  ") {
        return refuse("must not start or end with a space or hold two in a row".into());
    }
    Ok(name)
}

/// Checks a new password's length; `field` names where it came from.
pub fn check_password(field: &str, password: &str) -> Result<(), InvalidInput> {
    let chars = password.chars().count();
    // The value is never echoed: it is a secret even when refused.
    if chars < MIN_PASSWORD_CHARS {
        return Err(InvalidInput::new(
            field,
            "(hidden)",
            format!("too short: {chars} characters, at least {MIN_PASSWORD_CHARS} are needed"),
        ));
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(InvalidInput::new(field, "(hidden)", format!("longer than {MAX_PASSWORD_BYTES} bytes")));
    }
    Ok(())
}

/// argon2id with the crate's default cost (19 MiB, 2 passes): the floor a users file's
/// hashes must reach.
fn hasher() -> Argon2<'static> {
    Argon2::default()
}

/// The PHC string of `password` with a fresh random salt, after [`check_password`].
pub fn hash_password(password: &str) -> Result<String, InvalidInput> {
    check_password("password", password)?;
    let salt = SaltString::generate(&mut OsRng);
    let hash = hasher()
        .hash_password(password.as_bytes(), &salt)
        .map_err(|e| InvalidInput::new("password", "(hidden)", format!("cannot be hashed: {e}")))?;
    Ok(hash.to_string())
}

/// Checks a users file's hash field: argon2id, at least the default cost.
fn check_hash(phc: &str) -> Result<(), String> {
    if phc == PROXY_ONLY {
        return Ok(());
    }
    let hash = PasswordHash::new(phc).map_err(|e| format!("not a PHC hash string ({e})"))?;
    if hash.algorithm != Algorithm::Argon2id.ident() {
        return Err(format!("algorithm {} (expected argon2id)", hash.algorithm));
    }
    let params = Params::try_from(&hash).map_err(|e| format!("bad argon2 parameters ({e})"))?;
    let floor = Params::default();
    if params.m_cost() < floor.m_cost() || params.t_cost() < floor.t_cost() {
        return Err(format!(
            "cost m={} t={} is below m={} t={}",
            params.m_cost(),
            params.t_cost(),
            floor.m_cost(),
            floor.t_cost()
        ));
    }
    Ok(())
}

/// Whether `password` matches `phc` (CPU-heavy: call it off the async threads). A
/// proxy-only account has no password; a password outside the length rules never matches.
pub fn verify_password(phc: &str, password: &str) -> bool {
    if phc == PROXY_ONLY || check_password("password", password).is_err() {
        return false;
    }
    PasswordHash::new(phc).is_ok_and(|hash| hasher().verify_password(password.as_bytes(), &hash).is_ok())
}

/// A hash no password matches, verified against for unknown names so that a wrong name
/// costs the same time as a wrong password.
pub fn decoy_hash() -> String {
    let mut random = [0u8; 24];
    OsRng.fill_bytes(&mut random);
    hash_password(&hex::encode(random)).expect("48 hex digits is a valid password")
}

/// Every account, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Users {
    by_name: BTreeMap<String, Account>,
}

impl Users {
    /// Parses a users file: one `name role hash` a line (the name may hold spaces: the
    /// role and hash are the last two fields, and runs of blanks are one space), `#` comments and blank lines ignored. An
    /// error names the source, the line and what is wrong, never the hash.
    pub fn parse(source: &str, text: &str) -> Result<Users, String> {
        let mut by_name = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let at = format!("{source} line {}", i + 1);
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [words @ .., role, hash] = fields.as_slice() else {
                return Err(format!("{at}: expected `name role hash` (role viewer, operator or admin)"));
            };
            if words.is_empty() {
                return Err(format!("{at}: expected `name role hash` (role viewer, operator or admin)"));
            }
            let name = account_name("name", &words.join(" ")).map_err(|e| format!("{at}: {e}"))?;
            let role = Role::parse(role).map_err(|e| format!("{at}: {e}"))?;
            check_hash(hash).map_err(|why| {
                format!("{at}: the hash of {name:?} is refused: {why}; make one with `autocomp-monitor hash-password`")
            })?;
            let account = Account { name: name.clone(), role, hash: (*hash).to_owned() };
            if by_name.insert(name.clone(), account).is_some() {
                return Err(format!("{at}: {name:?} is listed twice (names are compared after NFC normalization)"));
            }
        }
        Ok(Users { by_name })
    }

    pub fn from_accounts(accounts: impl IntoIterator<Item = Account>) -> Users {
        Users { by_name: accounts.into_iter().map(|a| (a.name.clone(), a)).collect() }
    }

    pub fn get(&self, name: &str) -> Option<&Account> {
        self.by_name.get(name)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// The accounts a running monitor checks against: the users file, read again when it changes
/// (looked at every 2 s) or on SIGHUP (`watch`). A file that no longer parses is logged and
/// the accounts before it stay in force.
pub enum Accounts {
    File(Arc<Reloaded<Users>>),
    /// Fixed accounts (tests, or an embedding program).
    Fixed(Arc<Users>),
}

impl Accounts {
    /// Reads the users file; an error names the file and the line.
    pub fn load(path: &Path) -> Result<Accounts, String> {
        let file = path.to_owned();
        Ok(Accounts::File(Reloaded::new("the users file", vec![path.to_owned()], move || read(&file))?))
    }

    pub fn fixed(users: Users) -> Accounts {
        Accounts::Fixed(Arc::new(users))
    }

    pub fn current(&self) -> Arc<Users> {
        match self {
            Accounts::File(file) => file.current(),
            Accounts::Fixed(users) => Arc::clone(users),
        }
    }

    /// Reads the file again if it changed on disk since it was last read: whether new
    /// accounts are in force.
    pub fn reload_if_changed(&self) -> bool {
        matches!(self, Accounts::File(file) if file.reload(false))
    }

    /// Reads the file again when it changes or on SIGHUP, for as long as the monitor runs.
    /// Call within a tokio runtime.
    pub fn watch(&self) {
        if let Accounts::File(file) = self {
            file.watch();
        }
    }
}

fn read(path: &Path) -> Result<Users, String> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("users file {shown}: {e}"))?;
    // The rule every secret file is read by (once per process, however often it reloads).
    autocomp_toolkit::file_modes::warn_if_exposed(path, "the users file");
    Users::parse(&format!("users file {shown}"), &text)
}

/// Characters that are invisible or change the order of the text around them: one list,
/// which the terminal marks too, so a page and `autocomp show` show the same text.
pub use autocomp_toolkit::terminal::invisible;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_any_script_are_normalized_and_disguises_are_refused() {
        for ok in ["Åsa", "Jürgen", "佐藤", "alice", "Mary Ann", "o'brien@example.org"] {
            assert_eq!(account_name("name", ok).unwrap(), ok);
        }
        // A decomposed Å (A + combining ring) is the same account as the composed one.
        assert_eq!(account_name("name", "A\u{30A}sa").unwrap(), "Åsa");
        for (bad, shown) in [
            ("ann\u{202E}nimda", "U+202E"),
            ("\u{2066}bob", "U+2066"),
            ("al\u{200B}ice", "U+200B"),
            ("eve\u{200F}", "U+200F"),
            ("tab\there", "U+0009"),
            ("bell\u{7}", "U+0007"),
            ("line\u{2028}sep", "U+2028"),
            ("no\u{a0}break", "U+00A0"),
        ] {
            let error = account_name("name", bad).unwrap_err();
            assert_eq!((error.field.as_str(), error.value.as_str()), ("name", bad));
            assert!(error.reason.contains(shown), "{bad:?}: {error}");
        }
        for bad in ["", " lead", "trail ", "two  spaces", &"x".repeat(65)] {
            assert!(account_name("name", bad).is_err(), "{bad:?}");
        }
        assert!(account_name("name", &"佐".repeat(64)).is_ok(), "64 characters, whatever their bytes");
    }

    #[test]
    fn passwords_shorter_than_twelve_characters_are_refused_and_never_echoed() {
        let error = hash_password("eleven-char").unwrap_err();
        assert!(error.reason.contains("at least 12"), "{error}");
        assert!(!error.to_string().contains("eleven-char"));
        let hash = hash_password("correct horse battery").unwrap();
        assert!(hash.starts_with("$argon2id$"), "{hash}");
        assert!(verify_password(&hash, "correct horse battery"));
        assert!(!verify_password(&hash, "correct horse batterz"));
        assert!(!verify_password(PROXY_ONLY, "correct horse battery"));
        assert!(!verify_password(&decoy_hash(), "correct horse battery"));
    }

    #[test]
    fn a_users_file_is_parsed_line_by_line_and_errors_name_the_line() {
        let hash = hash_password("a long enough secret").unwrap();
        let text = format!(
            "# who may use the monitor\n\nalice operator {hash}\n  Åsa   viewer   {hash}\nMary Ann admin {hash}\n\
             proxy-user viewer -\n"
        );
        let users = Users::parse("users", &text).unwrap();
        assert_eq!(users.len(), 4);
        assert_eq!(users.get("Åsa").unwrap().role, Role::Viewer);
        assert_eq!(users.get("Mary Ann").unwrap().role, Role::Admin);
        assert_eq!(users.get("proxy-user").unwrap().hash, PROXY_ONLY);
        assert!(!format!("{:?}", users.get("alice").unwrap()).contains("argon2"), "no hash in Debug");

        let cases = [
            (format!("alice operator {hash}\nalice viewer {hash}\n"), "line 2", "twice"),
            (format!("alice root {hash}\n"), "line 1", "viewer, operator or admin"),
            ("alice operator\n".to_owned(), "line 1", "expected `name role hash`"),
            ("alice operator $2b$12$abcdefghijklmnopqrstuv\n".to_owned(), "line 1", "hash-password"),
            (format!("ev\u{202E}e operator {hash}\n"), "line 1", "U+202E"),
            (
                "weak operator $argon2id$v=19$m=1024,t=1,p=1$c2FsdHNhbHQ$c29tZWhhc2hzb21laGFzaHNvbWVoYXNo\n".to_owned(),
                "line 1",
                "below",
            ),
        ];
        for (text, line, why) in cases {
            let error = Users::parse("users", &text).unwrap_err();
            assert!(error.contains(line) && error.contains(why), "{text:?}: {error}");
            assert!(!error.contains(&hash), "{error}");
        }
    }

    #[test]
    fn a_changed_file_is_read_again_and_a_broken_one_keeps_the_accounts_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users");
        let hash = hash_password("a long enough secret").unwrap();
        std::fs::write(&path, format!("alice operator {hash}\n")).unwrap();
        let accounts = Accounts::load(&path).unwrap();
        assert!(!accounts.reload_if_changed());
        std::fs::write(&path, format!("alice operator {hash}\nbob viewer {hash}\n")).unwrap();
        assert!(accounts.reload_if_changed());
        assert_eq!(accounts.current().len(), 2);
        std::fs::write(&path, "broken\n").unwrap();
        assert!(!accounts.reload_if_changed());
        assert_eq!(accounts.current().len(), 2, "the accounts before stay in force");
        assert!(!accounts.reload_if_changed(), "a broken version is tried once");
    }
}
