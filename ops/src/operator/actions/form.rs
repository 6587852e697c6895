//! An [`Action`] as a form posts it: the monitor's action forms (one batch or many) post
//! these fields, so `Action` deserializes from them (and serializes to them) with the
//! checks and the words the monitor has always used. Apart from the action model because
//! it is about the fields of a form, not about what an action does.

use autocomp_model::InvalidInput;
use serde::{Deserialize, Serialize};

use super::{Action, RestartFrom};

/// The fields of an action form, each as posted (text): `action` names the action
/// (`rerun`, `restart`, `cancel`, `skip`, `acknowledge`, `prioritize`, `approve`, `reject`);
/// `component` (rerun, cancel, skip, acknowledge), `step` (approve, reject), `from` (restart: an event type or
/// [`RestartFrom::FIRST_FAILURE`]), `restart_from` (reject), `priority` (prioritize, a
/// whole number), and the checkboxes `force` (skip) and `record_anyway` (cancel), `1` when
/// checked. Other fields of the form (`reason`, `confirm`, `plan`, `key`, ...) are not the
/// action's and are ignored here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActionForm {
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub force: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record_anyway: Option<String>,
}

/// A checkbox: absent or empty is unchecked, `1` checked.
pub fn checkbox(name: &str, value: Option<&str>) -> Result<bool, InvalidInput> {
    match value {
        None | Some("") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(InvalidInput::new(name, other, "expected 1 (checked) or nothing")),
    }
}

impl ActionForm {
    /// A field that must be given (not blank), trimmed.
    fn required(value: Option<&String>, name: &str) -> Result<String, InvalidInput> {
        match value {
            Some(value) if !value.trim().is_empty() => Ok(value.trim().to_owned()),
            other => Err(InvalidInput::new(name, other.map(String::as_str).unwrap_or_default(), "required")),
        }
    }

    /// The fields only some actions take are refused on the others, in the order the
    /// monitor has always checked them.
    fn check_fields_for(&self, text: &str) -> Result<(bool, bool), InvalidInput> {
        let force = checkbox("force", self.force.as_deref())?;
        let record_anyway = checkbox("record_anyway", self.record_anyway.as_deref())?;
        let only_for = |name: &str, set: bool, action: &str| {
            if set && text != action {
                Err(InvalidInput::new(name, "1", format!("only a {action} takes it, not a {text}")))
            } else {
                Ok(())
            }
        };
        only_for("force", force, "skip")?;
        only_for("record_anyway", record_anyway, "cancel")?;
        if let Some(start) = self.restart_from()
            && text != "reject"
        {
            return Err(InvalidInput::new("restart_from", start, format!("only a reject takes it, not a {text}")));
        }
        if let Some(step) = &self.step
            && !["approve", "reject"].contains(&text)
        {
            return Err(InvalidInput::new(
                "step",
                step.as_str(),
                format!("only an approve or a reject takes it, not a {text}"),
            ));
        }
        Ok((force, record_anyway))
    }

    fn restart_from(&self) -> Option<&str> {
        self.restart_from.as_deref().map(str::trim).filter(|t| !t.is_empty())
    }
}

impl TryFrom<ActionForm> for Action {
    type Error = InvalidInput;

    fn try_from(form: ActionForm) -> Result<Action, InvalidInput> {
        let text = form.action.as_str();
        let (force, record_anyway) = form.check_fields_for(text)?;
        let component = || ActionForm::required(form.component.as_ref(), "component");
        let step = || ActionForm::required(form.step.as_ref(), "step");
        Ok(match text {
            "rerun" => Action::Rerun { component: component()? },
            "cancel" => Action::Cancel { component: component()?, record_anyway },
            "skip" => Action::Skip { component: component()?, force },
            "acknowledge" => Action::Acknowledge { component: component()? },
            "restart" => match ActionForm::required(form.from.as_ref(), "from")?.as_str() {
                RestartFrom::FIRST_FAILURE => Action::Restart { from: RestartFrom::FirstFailure },
                start => Action::Restart { from: RestartFrom::Type(start.to_owned()) },
            },
            "prioritize" => {
                let value = form.priority.as_deref().unwrap_or_default();
                let priority = value
                    .trim()
                    .parse::<i32>()
                    .map_err(|_| InvalidInput::new("priority", value, "expected a whole number (higher runs first)"))?;
                Action::Prioritize { priority }
            }
            "approve" => Action::Approve { step: step()? },
            "reject" => Action::Reject { step: step()?, restart_from: form.restart_from().map(str::to_owned) },
            other => {
                return Err(InvalidInput::new(
                    "action",
                    other,
                    "expected rerun, restart, cancel, skip, acknowledge, prioritize, approve or reject",
                ));
            }
        })
    }
}

impl From<Action> for ActionForm {
    fn from(action: Action) -> ActionForm {
        let checked = |set: bool| set.then(|| "1".to_owned());
        let mut form = ActionForm { action: action.name().to_owned(), ..ActionForm::default() };
        match action {
            Action::Rerun { component } | Action::Acknowledge { component } => form.component = Some(component),
            Action::Cancel { component, record_anyway } => {
                form.component = Some(component);
                form.record_anyway = checked(record_anyway);
            }
            Action::Skip { component, force } => {
                form.component = Some(component);
                form.force = checked(force);
            }
            Action::Restart { from: RestartFrom::FirstFailure } => form.from = Some(RestartFrom::FIRST_FAILURE.into()),
            Action::Restart { from: RestartFrom::Type(start) } => form.from = Some(start),
            Action::Prioritize { priority } => form.priority = Some(priority.to_string()),
            Action::Approve { step } => form.step = Some(step),
            Action::Reject { step, restart_from } => {
                form.step = Some(step);
                form.restart_from = restart_from;
            }
        }
        form
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &str) -> Result<Action, String> {
        let form: ActionForm = serde_json::from_value(serde_json::from_str(pairs).unwrap()).unwrap();
        Action::try_from(form).map_err(|e| e.to_string())
    }

    #[test]
    fn each_action_reads_from_the_monitors_fields_and_writes_back_to_them() {
        let cases = [
            (r#"{"action":"rerun","component":" archiver "}"#, Action::Rerun { component: "archiver".into() }),
            (
                r#"{"action":"cancel","component":"a","record_anyway":"1"}"#,
                Action::Cancel { component: "a".into(), record_anyway: true },
            ),
            (r#"{"action":"skip","component":"a","force":""}"#, Action::Skip { component: "a".into(), force: false }),
            (r#"{"action":"restart","from":"first-failure"}"#, Action::Restart { from: RestartFrom::FirstFailure }),
            (r#"{"action":"restart","from":"Probed"}"#, Action::Restart { from: RestartFrom::Type("Probed".into()) }),
            (r#"{"action":"prioritize","priority":" -3 "}"#, Action::Prioritize { priority: -3 }),
            (r#"{"action":"approve","step":"review"}"#, Action::Approve { step: "review".into() }),
            (
                r#"{"action":"reject","step":"review","restart_from":"Probed","reason":"ignored"}"#,
                Action::Reject { step: "review".into(), restart_from: Some("Probed".into()) },
            ),
        ];
        for (fields, action) in cases {
            assert_eq!(form(fields), Ok(action.clone()), "{fields}");
            let back = serde_json::to_value(&action).unwrap();
            assert_eq!(serde_json::from_value::<Action>(back).unwrap(), action);
        }
        assert_eq!(
            serde_json::to_string(&Action::Cancel { component: "a".into(), record_anyway: true }).unwrap(),
            r#"{"action":"cancel","component":"a","record_anyway":"1"}"#
        );
    }

    #[test]
    fn wrong_fields_are_refused_in_the_monitors_words() {
        let refused = [
            (r#"{"action":"zap"}"#, "action", "expected rerun, restart"),
            (r#"{}"#, "action", "expected rerun, restart"),
            (r#"{"action":"rerun"}"#, "component", "required"),
            (r#"{"action":"rerun","component":"a","force":"1"}"#, "force", "only a skip takes it, not a rerun"),
            (r#"{"action":"skip","component":"a","force":"yes"}"#, "force", "expected 1 (checked) or nothing"),
            (r#"{"action":"skip","component":"a","record_anyway":"1"}"#, "record_anyway", "only a cancel"),
            (r#"{"action":"approve","step":"s","restart_from":"X"}"#, "restart_from", "only a reject"),
            (r#"{"action":"rerun","component":"a","step":""}"#, "step", "only an approve or a reject"),
            (r#"{"action":"prioritize","priority":"high"}"#, "priority", "expected a whole number"),
            (r#"{"action":"restart","from":"  "}"#, "from", "required"),
        ];
        for (fields, name, words) in refused {
            let error = form(fields).unwrap_err();
            assert!(error.contains(name) && error.contains(words), "{fields}: {error}");
        }
    }
}
