//! The Kubernetes client of every command and task: its configuration
//! (kubeconfig, context or in-cluster) and the parameters of every patch.

use std::path::Path;

use crate::Error;

/// The field manager of every write of the controller (server-side
/// bookkeeping of which fields it set: `metadata.managedFields`).
pub const FIELD_MANAGER: &str = "mountguard-controller";

/// Parameters of every patch the controller sends, naming
/// [`FIELD_MANAGER`].
pub fn patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    }
}

/// The Kubernetes client configuration of every command: the kubeconfig
/// file `kubeconfig` if given (its `context`, else its current one); else,
/// with a `context`, that context of the default kubeconfig; else inferred
/// (KUBECONFIG, ~/.kube/config, or in-cluster).
pub async fn kube_config(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Config, Error> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    match (kubeconfig, context) {
        (Some(p), _) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .map_err(|e| Error::Kube(format!("reading kubeconfig {}: {e}", p.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| Error::Kube(format!("kubeconfig {}: {e}", p.display())))
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::Kube(format!("kubeconfig: {e}"))),
        (None, None) => kube::Config::infer().await.map_err(|e| {
            Error::Kube(format!(
                "no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster): {e}"
            ))
        }),
    }
}

/// A client of `config`.
pub fn kube_client(config: kube::Config) -> Result<kube::Client, Error> {
    kube::Client::try_from(config).map_err(|e| Error::Kube(format!("creating the client: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_patch_names_the_field_manager() {
        let p = patch_params();
        assert_eq!(p.field_manager.as_deref(), Some("mountguard-controller"));
        assert!(!p.force, "merge patches are never forced");
    }
}
