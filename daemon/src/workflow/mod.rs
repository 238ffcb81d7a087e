//! Workflows without Kubernetes: Tink's Templates and Workflows, rendered
//! and run by tinkerbox itself (tink-controller's and tink-server's jobs).
//!
//! - [`engine`]: the state machine (so far: rendering) and its loop;
//! - [`template`]: the rendered template document and its rules;
//! - [`render`]: Go text/template rendering with tink-controller's data;
//! - [`funcs`]: the functions a Template may call;
//! - [`model`]: the Template and Workflow documents and the Workflow status.

pub mod agent;
pub mod engine;
pub mod funcs;
pub mod model;
pub mod render;
pub mod template;
