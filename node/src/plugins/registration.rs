//! One plugin's registration (`operationexecutor/operation_generator.go`
//! `GenerateRegisterPluginFunc`): dial its socket, `GetInfo`, pick the
//! handler of its type, validate, register, and tell the plugin the outcome
//! with `NotifyRegistrationStatus`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keelson_cri::kubelet_api::pluginregistration::registration_client::RegistrationClient;
use keelson_cri::kubelet_api::pluginregistration::{InfoRequest, RegistrationStatus};
use keelson_cri::kubelet_api::unix_channel;
use tonic::transport::Channel;

use super::{Handlers, PluginHandler};

/// `dialTimeoutDuration`.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The `GetInfo` deadline.
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// `notifyTimeoutDuration`.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// A registered plugin (`cache.PluginInfo`).
pub(crate) struct Registered {
    pub(crate) generation: u64,
    pub(crate) handler: Arc<dyn PluginHandler>,
    pub(crate) name: String,
    pub(crate) endpoint: String,
}

async fn notify(
    client: &mut RegistrationClient<Channel>,
    registered: bool,
    error: String,
) -> Result<(), String> {
    let call = client.notify_registration_status(RegistrationStatus {
        plugin_registered: registered,
        error: error.clone(),
    });
    match tokio::time::timeout(NOTIFY_TIMEOUT, call).await {
        Ok(Ok(_)) => {}
        Ok(Err(s)) => return Err(format!("{error}: {}", s.message())),
        Err(_) => return Err(format!("{error}: context deadline exceeded")),
    }
    if error.is_empty() { Ok(()) } else { Err(error) }
}

/// Registers the plugin on `socket`.
pub(crate) async fn register(
    socket: &Path,
    generation: u64,
    handlers: &Handlers,
) -> Result<Registered, String> {
    let path = socket.display().to_string();
    let channel = unix_channel(socket, DIAL_TIMEOUT)
        .await
        .map_err(|e| format!("RegisterPlugin error -- dial failed at socket {path}, err: {e}"))?;
    let mut client = RegistrationClient::new(channel);
    let info = match tokio::time::timeout(GET_INFO_TIMEOUT, client.get_info(InfoRequest {})).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => {
            return Err(format!(
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {path}, err: {}",
                s.message()
            ));
        }
        Err(_) => {
            return Err(format!(
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {path}, err: context deadline exceeded"
            ));
        }
    };
    let Some(handler) = handlers.get(&info.r#type).cloned() else {
        let msg = format!(
            "RegisterPlugin error -- no handler registered for plugin type: {} at socket {path}",
            info.r#type
        );
        notify(&mut client, false, msg.clone()).await?;
        return Err(msg);
    };
    let endpoint = if info.endpoint.is_empty() {
        path.clone()
    } else {
        info.endpoint.clone()
    };
    if let Err(e) = handler.validate(&info.name, &endpoint, &info.supported_versions) {
        notify(
            &mut client,
            false,
            format!("RegisterPlugin error -- plugin validation failed with err: {e}"),
        )
        .await?;
        return Err("RegisterPlugin error -- pluginHandler.ValidatePluginFunc failed".into());
    }
    if let Err(e) = handler
        .register(&info.name, &endpoint, &info.supported_versions)
        .await
    {
        notify(
            &mut client,
            false,
            format!("RegisterPlugin error -- plugin registration failed with err: {e}"),
        )
        .await?;
        return Err(e);
    }
    if let Err(e) = notify(&mut client, true, String::new()).await {
        handler.deregister(&info.name, &endpoint);
        return Err(format!(
            "RegisterPlugin error -- failed to send registration status at socket {path}, err: {e}"
        ));
    }
    tracing::info!(plugin = %info.name, r#type = %info.r#type, %endpoint, "plugin registered");
    Ok(Registered {
        generation,
        handler,
        name: info.name,
        endpoint,
    })
}
