//! The names `autocomp new` is given, checked before anything is written: the component's
//! (also a crate, binary or Python module name) and the event types it requires.

use autocomp_model::{ComponentName, EventType, InvalidInput};

use super::DEFAULT_REQUIRES;

/// A component name that is also a good crate and binary name.
pub(super) fn crate_name(name: &str) -> Result<ComponentName, InvalidInput> {
    let valid = ComponentName::new(name)?;
    let refuse = |reason: &str| Err(InvalidInput::new("component", name, reason));
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return refuse("must start with a lower-case letter: it is also the crate's name");
    }
    if name.contains('.') {
        return refuse("must not contain '.': it is also the crate's name (letters, digits, '-' and '_')");
    }
    if name.chars().any(|c| c.is_ascii_uppercase()) {
        return refuse("must be lower-case: it is also the crate's name, which the compiler wants in snake case");
    }
    if RESERVED.split_whitespace().any(|word| word == name.replace('-', "_")) {
        return refuse("is a Rust keyword or a name cargo reserves; choose another name");
    }
    Ok(valid)
}

/// Rust keywords and the names cargo refuses for a package or keeps for itself.
const RESERVED: &str = "abstract alloc as async await become box break build const continue core crate deps do \
    dyn else enum examples extern false final fn for gen if impl in incremental let loop macro match mod move mut \
    override priv proc_macro pub ref return self static std struct super test trait true try type typeof unsafe \
    unsized use virtual where while yield";

pub(super) fn requires(given: &[String], own: &EventType) -> Result<Vec<String>, InvalidInput> {
    if given.is_empty() {
        return Ok(vec![DEFAULT_REQUIRES.to_owned()]);
    }
    let mut requires = Vec::new();
    for value in given {
        let event_type =
            EventType::new(value.as_str()).map_err(|e| InvalidInput::new("required event type", value, e.reason))?;
        if event_type == *own {
            let reason = "is the event type the component records; a batch could never be ready for it";
            return Err(InvalidInput::new("required event type", value, reason));
        }
        if requires.contains(value) {
            return Err(InvalidInput::new("required event type", value, "is named twice"));
        }
        requires.push(value.clone());
    }
    Ok(requires)
}

/// The Python module name of a component name ('-' as '_'), refused when Python could not
/// import it or it would shadow a module the step or its test imports.
pub(super) fn python_module(name: &str) -> Result<String, InvalidInput> {
    let module = name.replace('-', "_");
    let refuse = |reason: &str| Err(InvalidInput::new("component", name, reason));
    if !module.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') || module.contains('.') {
        return refuse("must start with a letter and hold no '.': it is also the step's Python module name");
    }
    if PYTHON_RESERVED.split_whitespace().any(|word| word == module) {
        return refuse(
            "is a Python keyword or a module the step imports (its file would shadow it); choose another name",
        );
    }
    Ok(module)
}

/// Python keywords and the modules a generated step, its test and autocomp_step import.
const PYTHON_RESERVED: &str = "False None True and as assert async await break class continue def del elif else \
    except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield \
    autocomp_step autocomp_step_build contextlib dataclasses io json os pathlib subprocess sys tempfile test \
    tests textwrap traceback typing unittest";
