//! The GetContainerEvents stream as a plain `Stream` of results.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::{self, BoxStream, Stream, StreamExt};
use k8s_cri::v1 as api;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::error::CriError;

const METHOD: &str = "GetContainerEvents";

/// Container lifecycle events from the runtime (CRI GetContainerEvents).
///
/// Each item is one [`api::ContainerEventResponse`] (container id, event
/// type, time, and the sandbox's and its containers' statuses) or the error
/// that ended the stream; after an error the stream yields `None`. The
/// stream has no deadline: it lives as long as the runtime keeps it open.
/// Some runtimes send the response headers only with the first event, so
/// the stream is opened on first poll rather than awaited up front.
pub struct ContainerEventStream {
    inner: BoxStream<'static, Result<api::ContainerEventResponse, CriError>>,
}

impl std::fmt::Debug for ContainerEventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ContainerEventStream")
    }
}

impl ContainerEventStream {
    pub(crate) fn open(mut client: RuntimeServiceClient<Channel>) -> Self {
        let opened = async move {
            client
                .get_container_events(tonic::Request::new(api::GetEventsRequest {}))
                .await
        };
        let inner = stream::once(opened)
            .flat_map(|result| match result {
                Ok(response) => response
                    .into_inner()
                    .map(|item| item.map_err(|status| CriError::from_status(METHOD, &status)))
                    .left_stream(),
                Err(status) => {
                    stream::iter([Err(CriError::from_status(METHOD, &status))]).right_stream()
                }
            })
            // Stop after the first error: nothing useful follows it.
            .scan(false, |failed, item| {
                if *failed {
                    return futures::future::ready(None);
                }
                *failed = item.is_err();
                futures::future::ready(Some(item))
            })
            .boxed();
        ContainerEventStream { inner }
    }
}

impl Stream for ContainerEventStream {
    type Item = Result<api::ContainerEventResponse, CriError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}
