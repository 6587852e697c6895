//! A batch action's form, posted or in a preview's address: which fields each form and
//! address may carry, the action read from them as the operator module's `Action` (through
//! its `ActionForm`, whose checks name a wrong field and its value: a 400), and what a
//! confirm carries.

use autocomp_model::{IdempotencyKey, InvalidInput};
use autocomp_ops::operator::{Action, ActionForm};

use super::confirm::{self, check_names, field, typed};
use super::error::WebError;
use super::html::hidden_fields;

/// An action form, posted or in a preview's address, checked field by field.
pub(super) struct Posted {
    pub(super) action: Action,
    pub(super) reason: String,
    /// Present when confirming a preview.
    pub(super) confirm: Option<Confirm>,
    /// The action's fields (and a bulk action's filter): every field but `confirm`, `plan`,
    /// `key` and `since`, for the preview's address and its confirm form.
    pub(super) fields: Vec<(String, String)>,
}

/// What a confirm carries: the plan it confirms and its idempotency key.
pub(super) struct Confirm {
    pub(super) plan: String,
    pub(super) key: IdempotencyKey,
}

/// The fields of an action on one batch; a bulk action's add its filter (`q`, `order`).
const ACTION_FIELDS: &[&str] =
    &["action", "component", "step", "from", "restart_from", "priority", "reason", "force", "record_anyway"];

/// Which fields a form or a preview's address may carry.
#[derive(Clone, Copy)]
pub(super) enum Carrier {
    /// `POST /batches/{id}/act`: the action's fields, and a confirm's `confirm`, `plan`, `key`.
    OneForm,
    /// `POST /bulk`: the same and the filter.
    BulkForm,
    /// A preview's address: the action's fields and its key, never `confirm` or `plan`.
    OneQuery,
    /// A bulk preview's address: the same, the filter and `since`.
    BulkQuery,
}

impl Carrier {
    fn known(self) -> Vec<&'static str> {
        let extra: &[&str] = match self {
            Carrier::OneForm => &["confirm", "plan", "key"],
            Carrier::BulkForm => &["confirm", "plan", "key", "q", "order"],
            Carrier::OneQuery => &["key"],
            Carrier::BulkQuery => &["key", "q", "order", "since"],
        };
        ACTION_FIELDS.iter().chain(extra).copied().collect()
    }
}

impl Posted {
    pub(super) fn parse(fields: Vec<(String, String)>, carrier: Carrier) -> Result<Posted, WebError> {
        check_names(&fields, &carrier.known())?;
        let action = Action::try_from(typed::<ActionForm>(&fields)?)?;
        let confirm = confirm(&fields)?;
        // The operator module checks the reason (non-empty, bounded) in its own words.
        let reason = field(&fields, "reason").unwrap_or_default().to_owned();
        let fields = fields
            .into_iter()
            .filter(|(name, _)| !["confirm", "plan", "key", "since"].contains(&name.as_str()))
            .collect();
        Ok(Posted { action, reason, confirm, fields })
    }

    /// The hidden fields of the confirm form: the action's, the plan, the preview's key.
    pub(super) fn confirm_fields(&self, plan: &str, key: &IdempotencyKey) -> String {
        let mut fields = self.fields.clone();
        fields.extend([
            ("plan".to_owned(), plan.to_owned()),
            ("key".to_owned(), key.to_string()),
            ("confirm".into(), "1".into()),
        ]);
        hidden_fields(&fields)
    }

    /// The preview's address: `path`, the action's fields, then `extra` (the key, and for
    /// a bulk action `since`), each name and value percent-encoded.
    pub(super) fn preview_url(&self, path: &str, extra: &[(&str, &str)]) -> String {
        confirm::preview_url(path, &self.fields, extra)
    }

    /// The address a preview asked for is sent to, once what would not fit is refused.
    pub(super) fn address(&self, path: &str, extra: &[(&str, &str)]) -> Result<String, WebError> {
        confirm::address(path, &self.fields, &self.reason, extra)
    }
}

/// What a confirm carries, if the fields are a confirm's: its plan and key, both required.
fn confirm(fields: &[(String, String)]) -> Result<Option<Confirm>, WebError> {
    let get = |name: &str| field(fields, name);
    match get("confirm") {
        None | Some("") => Ok(None),
        Some("1") => {
            let missing =
                |name: &str| InvalidInput::new(name, "", "required to confirm: the confirm form of a preview posts it");
            let plan = get("plan").filter(|p| !p.is_empty()).ok_or_else(|| missing("plan"))?.to_owned();
            let key = get("key").filter(|k| !k.is_empty()).ok_or_else(|| missing("key"))?;
            let key = IdempotencyKey::new(key).map_err(|e| InvalidInput::new("key", key, e.reason))?;
            Ok(Some(Confirm { plan, key }))
        }
        Some(other) => Err(InvalidInput::new("confirm", other, "expected 1").into()),
    }
}
