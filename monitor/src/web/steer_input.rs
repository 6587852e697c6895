//! A steering form, posted or in a preview's address: the fields each may carry, the action
//! read from them as the operator module's `SteerAction` (through its `SteerForm`, whose
//! checks name a wrong field and its value: a 400), the preview's address, and how a
//! preview finds its change in the steering log.

use autocomp_model::{ComponentName, InvalidInput, SteeringChange, SteeringEntry};
use autocomp_ops::operator::{Scope, SteerAction, SteerForm};

use super::confirm::{self, check_names, field, typed};
use super::error::WebError;

/// Where a steering form posts, and its preview's path.
pub(super) const PATH: &str = "/steer";

/// The fields that say what the action is: carried by the address and the confirm form.
const ACTION_FIELDS: &[&str] = &["action", "component", "all", "pool", "size", "reason"];

/// Which fields a steering form or a preview's address may carry.
#[derive(Clone, Copy)]
pub(super) enum Carrier {
    /// `POST /steer`: the action's fields; a confirm adds `confirm` and `version`.
    Form,
    /// A steering preview's address: the action's fields, `since` and `key`.
    Query,
}

impl Carrier {
    fn known(self) -> Vec<&'static str> {
        let extra: &[&str] = match self {
            Carrier::Form => &["confirm", "version"],
            Carrier::Query => &["since", "key"],
        };
        ACTION_FIELDS.iter().chain(extra).copied().collect()
    }
}

/// A steering form, posted or in a preview's address, checked field by field.
pub(super) struct Steer {
    pub(super) action: SteerAction,
    pub(super) reason: String,
    /// A confirm's: the steering version its preview planned against.
    pub(super) version: Option<u64>,
    /// The action's fields, for the preview's address and its confirm form.
    pub(super) fields: Vec<(String, String)>,
}

impl Steer {
    pub(super) fn parse(fields: Vec<(String, String)>, carrier: Carrier) -> Result<Steer, WebError> {
        check_names(&fields, &carrier.known())?;
        let action = SteerAction::try_from(typed::<SteerForm>(&fields)?)?;
        let version = version(&fields)?;
        let reason = field(&fields, "reason").unwrap_or_default().to_owned();
        let fields = fields.into_iter().filter(|(name, _)| ACTION_FIELDS.contains(&name.as_str())).collect();
        Ok(Steer { action, reason, version, fields })
    }

    /// The preview's address: the action's fields, then `since` and `key`, each
    /// percent-encoded; the reason checked first in the operator module's words, and any
    /// other field too long for an address refused.
    pub(super) fn address(&self, since: u64, key: &str) -> Result<String, WebError> {
        let since = since.to_string();
        confirm::address(PATH, &self.fields, &self.reason, &[("since", since.as_str()), ("key", key)])
    }

    /// What the action is about, in words: `pause archiver`, `pool set tape`.
    pub(super) fn title(&self) -> String {
        match &self.action {
            SteerAction::Pause { scope } | SteerAction::Drain { scope } | SteerAction::Resume { scope, .. } => {
                let what = match scope {
                    Scope::All => "the whole pipeline".to_owned(),
                    Scope::Component(name) => name.clone(),
                };
                let rerun = matches!(self.action, SteerAction::Resume { rerun_failed: true, .. });
                format!("{} {what}{}", self.action.name(), if rerun { " and rerun its failed batches" } else { "" })
            }
            SteerAction::SetPool { pool, size } => format!("pool {pool}: size {size}"),
        }
    }

    /// Whether the log's `change` is this action's.
    fn made(&self, change: &SteeringChange) -> bool {
        let named = |scope: &Scope, component: &Option<ComponentName>| match (scope, component) {
            (Scope::All, None) => true,
            (Scope::Component(name), Some(component)) => component.as_str() == name,
            _ => false,
        };
        match (&self.action, change) {
            (SteerAction::Pause { scope }, SteeringChange::Pause { component, drain: false })
            | (SteerAction::Drain { scope }, SteeringChange::Pause { component, drain: true })
            | (SteerAction::Resume { scope, .. }, SteeringChange::Resume { component }) => named(scope, component),
            (SteerAction::SetPool { pool, size }, SteeringChange::SetPool { pool: made, size: made_size }) => {
                made.as_str() == pool && made_size == size
            }
            _ => false,
        }
    }

    /// The log's entry of this action confirmed after `since` by `name` with this reason, if
    /// the newest entries hold one: its preview was confirmed.
    pub(super) fn done_in<'l>(&self, log: &'l [SteeringEntry], name: &str, since: u64) -> Option<&'l SteeringEntry> {
        let agent = format!("operator:{name}");
        log.iter()
            .filter(|e| e.version > since && e.by.to_string() == agent && e.reason == self.reason.trim())
            .filter(|e| self.made(&e.change))
            .min_by_key(|e| e.version)
    }
}

/// A confirm's steering version, if the fields are a confirm's.
fn version(fields: &[(String, String)]) -> Result<Option<u64>, WebError> {
    match field(fields, "confirm") {
        None | Some("") => Ok(None),
        Some("1") => {
            let text = field(fields, "version").unwrap_or_default();
            let version = text.parse::<u64>().map_err(|_| {
                InvalidInput::new(
                    "version",
                    text,
                    "required to confirm: the steering version the preview planned against (the confirm form of a \
                     preview posts it)",
                )
            })?;
            Ok(Some(version))
        }
        Some(other) => Err(InvalidInput::new("confirm", other, "expected 1").into()),
    }
}
