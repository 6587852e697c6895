//! Who this process is, as runs, events, lock nodes and the registry record it.

use autocomp_model::{Agent, Timestamp};

use crate::exit::RunError;
use crate::locks::LockHolder;

/// Who this process is, as recorded in runs, events and lock nodes.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `<component>/<version>@<host>#<pid>`: the agent of every event and run it records.
    pub agent: Agent,
    /// The host name (`localhost` when it cannot be read).
    pub host: String,
    /// This process.
    pub pid: u32,
}

impl Identity {
    /// This process running `component` at `version`; a usage error if the names do not
    /// make a valid agent.
    pub fn of(component: &str, version: &str) -> Result<Self, RunError> {
        let host = hostname();
        let pid = std::process::id();
        let agent =
            Agent::new(format!("{component}/{version}@{host}#{pid}")).map_err(|e| RunError::Usage(e.to_string()))?;
        Ok(Self { agent, host, pid })
    }

    /// What a lock node this process takes says of its holder.
    pub fn lock_holder(&self) -> LockHolder {
        LockHolder { agent: self.agent.to_string(), host: self.host.clone(), pid: self.pid, since: Timestamp::now() }
    }
}

/// This host's name as locks, runs and the registry record it (`localhost` when unknown).
pub fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let clean: String = raw.trim().chars().filter(|c| c.is_ascii_graphic()).take(255).collect();
    if clean.is_empty() { "localhost".into() } else { clean }
}
