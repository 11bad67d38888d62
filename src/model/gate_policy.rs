//! `GatePolicy`: bake time, evaluation interval, and the named gates a release must pass.
