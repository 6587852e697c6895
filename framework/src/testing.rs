//! Test helpers for components: run a component's `work` on a directory and get its report
//! back, and a temporary pipeline (store, index, locks in a temp dir) to run its binary in.
