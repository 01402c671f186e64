//! Evaluation: expected versus observed content, verdicts, and the explicit
//! history ([`EngineState`]) the engine needs between evaluations.
//!
//! Pure: no clock reads (`now` is an argument), no I/O. The only mutable
//! input is the `&mut EngineState` a caller owns, may persist, or may
//! rebuild from scratch.
//!
//! * [`types`]: configuration, states, verdicts, the output view;
//! * [`advice`]: one sentence of what to do per verdict;
//! * [`subject`]: what a verdict is about and how it is written;
//! * [`present`]: a pod's verdicts as the metrics and the Events tell them
//!   (state counts, series labels, Event text) and what they were
//!   computed against;
//! * [`history`]: the engine state;
//! * `cache`: memoization within one evaluation;
//! * `engine`: the loop over nodes and pods;
//! * `rules`: how each verdict is decided (one file, top to bottom);
//! * `view`: the types the loop hands the rules and they hand back.

pub mod advice;
mod cache;
mod engine;
pub mod history;
pub mod output;
pub mod present;
mod rules;
pub mod subject;
pub mod types;
mod view;

#[cfg(test)]
pub(crate) mod test_support;

pub use advice::{SubjectKind, advice};
pub use engine::Engine;
pub use history::{
    EngineState, KeyHistory, NodeHistory, PodHistory, PresentContent, SourceHistory, SubjectHistory,
};
pub use output::{SourceView, VerdictView};
pub use subject::{Subject, SubjectId, SubjectKey, subject_of};
pub use types::*;
