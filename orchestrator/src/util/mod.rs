//! Small helpers every stage may use; leaves (they import nothing of the crate).

pub mod failpoint;
pub mod par;
pub mod shell;
pub mod size;
pub mod table;
