//! Pod status: generation from the runtime's view (`generate`), the patch
//! kubelet sends (`patch`) and the status manager that writes it (`manager`).

pub mod generate;
pub mod manager;
pub mod normalize;
pub mod patch;
pub mod resources;

pub use generate::{
    ContainerReadiness, NoReadinessProbes, StartFailure, StatusInputs, generate_pod_status,
};
pub use manager::{StatusManager, StatusTargets};
