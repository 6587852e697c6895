//! A pass its configuration refuses before a runner exists (a component file that does not
//! parse, a misspelt key, a setting of the wrong type, a trigger clause refused: exit 2) is
//! told to the component registry as a pass that did not start, with the reason, as a pass
//! a broken contract refuses is: `autocomp pipeline`, `alerts` and the monitor then say why
//! the component does no work, where before only cron's mail did.

use std::path::Path;
use std::time::Duration;

use autocomp_model::{ComponentName, EventType, PassOutcome, PassPhase};
use tracing::debug;

use crate::component::Component;
use crate::config::{self, Backends, ComponentConfig};
use crate::exit::RunError;
use crate::runner::Identity;

/// The most the registry is given to hear of a refused pass: the pass exits 2 regardless,
/// and a store that does not answer must not hold cron's next pass up.
const TELL_WITHIN: Duration = Duration::from_secs(10);
/// The most characters of the reason the registry keeps.
const REASON_CHARS: usize = 500;

/// Tells the registry that `component`'s pass did not start, for `reason`. Best effort: the
/// store is the one the shared file or the command line names (a component file that does
/// not parse names none); nothing is told when there is none, or it cannot be reached.
pub(crate) async fn tell_registry<C: Component>(component: &C, config_dir: &Path, overrides: Backends, reason: &str) {
    let Some(store_url) = store_url(config_dir, overrides) else { return };
    // What the registry shows to everyone who can read it (the monitor, alerts, their mail):
    // one line, any URL's password hidden, bounded.
    let reason = autocomp_toolkit::redact::redact_urls_in(&autocomp_toolkit::terminal::one_line(reason));
    let reason: String = match reason.char_indices().nth(REASON_CHARS) {
        Some((end, _)) => format!("{}…", &reason[..end]),
        None => reason,
    };
    match tokio::time::timeout(TELL_WITHIN, tell(component, &store_url, &reason)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!("cannot tell the component registry of the refused pass: {e}"),
        Err(_) => debug!("cannot tell the component registry of the refused pass within {TELL_WITHIN:?}"),
    }
}

/// The store the shared file names, overridden by the environment and the command line.
fn store_url(config_dir: &Path, overrides: Backends) -> Option<String> {
    let shared_file = config_dir.join(config::SHARED_FILE);
    let shared = std::fs::read_to_string(&shared_file)
        .ok()
        .and_then(|text| config::parse_shared_file(&text, &shared_file).ok())
        .unwrap_or_default();
    Backends::overridden_by(shared, overrides).store
}

async fn tell<C: Component>(component: &C, store_url: &str, reason: &str) -> Result<(), RunError> {
    let store = autocomp_store::open_store(store_url).await?;
    let name = ComponentName::new(component.name()).map_err(|e| RunError::Usage(e.to_string()))?;
    // The registry keeps what the component's last good pass described; one never
    // registered is described with the configuration's defaults until a pass starts.
    let registered = store.components().await?.into_iter().find(|registered| registered.name() == &name);
    let descriptor = match registered {
        // Retired by an operator: it comes back only by running a pass, and this one did not.
        Some(registered) if registered.is_retired() => return Ok(()),
        Some(registered) => registered.descriptor,
        None => {
            let event_type = EventType::new(component.event_type()).map_err(|e| RunError::Usage(e.to_string()))?;
            let config = ComponentConfig::default();
            crate::component::descriptor_of(component, &config, (name, event_type), component.trigger())
        }
    };
    let identity = Identity::of(component.name(), component.version())?;
    let phase = PassPhase::Ended {
        outcome: PassOutcome::Error,
        summary: format!("{}{reason}", autocomp_model::NOT_STARTED),
        duration_ms: 0,
        work: Vec::new(),
    };
    crate::runner::record_pass(store.as_ref(), &descriptor, &identity, phase).await
}
