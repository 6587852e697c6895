//! The autocomp operator application: what a person runs to see and steer a pipeline.
//! `operator` holds every operator action and view (one implementation, used by the
//! `autocomp` command and the monitor), the alerts and the pipeline metrics; `demo` builds
//! and runs a small pipeline on the embedded backends; `scaffold` writes a new component
//! crate; `doctor` checks a host end to end. The `autocomp` binary is a thin command line
//! over these.

pub mod demo;
pub mod doctor;
pub mod notify;
pub mod operator;
pub mod scaffold;
