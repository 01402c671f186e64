//! `mountguard-controller verify`: the engine run offline on objects and
//! inventories read from files (`load.rs`), judged and printed
//! (`verify.rs`).

pub mod load;
pub mod verify;
