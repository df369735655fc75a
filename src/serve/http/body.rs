//! Request bodies against their principal's share of buffered bytes
//! (`budgets.rs`), read whole as they arrive, and the refusals a share
//! answers with: apart from routing, since every route's body passes here.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::{HttpState, text};
use crate::serve::budgets::{Principal, Share};

/// A refusal for a principal at its share: 429 (503 for the instance's
/// total of buffered bytes) with Retry-After, counted.
pub(super) fn share_refusal(share: Share, principal: &Principal, what: &str) -> Response {
    crate::metrics::http_share_refusal(share.as_str(), principal.kind());
    let status = match share {
        Share::BufferedTotal => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::TOO_MANY_REQUESTS,
    };
    let mut response = text(
        status,
        &format!("{what}; retry in {} s\n", share.retry_after()),
    );
    if let Ok(v) = share.retry_after().to_string().parse() {
        response.headers_mut().insert(header::RETRY_AFTER, v);
    }
    response
}

/// A response after which the connection is closed (a request that failed
/// authentication must not keep its connection idle).
pub(super) fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// Request bodies count against their principal's share of buffered bytes
/// while they arrive, and are read whole here (rmcp reads them whole
/// anyway) so that one that does not fit is answered 429 (503 for the
/// instance's total) with Retry-After, never cut off under another name. A
/// declared length is held in full from the head on, so heads that declare
/// more than fits are refused before a byte of their bodies is read.
pub(super) async fn meter_body(
    State(state): State<Arc<HttpState>>,
    req: Request,
    next: Next,
) -> Response {
    use futures::StreamExt;
    let Some(principal) = req.extensions().get::<Principal>().cloned() else {
        return next.run(req).await;
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    let chunked = req
        .headers()
        .get(header::TRANSFER_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    let limit = state.config.max_request_body_bytes;
    if declared.unwrap_or(0) == 0 && !chunked {
        return next.run(req).await;
    }
    if declared.is_some_and(|n| n > limit) {
        // Not a matter of shares: the body limit refuses it (413).
        return next.run(req).await;
    }
    let refused = |share: Share| {
        closing(share_refusal(
            share,
            &principal,
            "the request bodies this server buffers for this client, or for all, are at their limit (--http-max-buffered-bytes)",
        ))
    };
    let mut held = match state.door.hold_bytes(&principal, declared.unwrap_or(0)) {
        Ok(held) => held,
        Err(share) => return refused(share),
    };
    let (parts, body) = req.into_parts();
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0));
    while let Some(data) = stream.next().await {
        let Ok(data) = data else {
            return closing(text(
                StatusCode::BAD_REQUEST,
                "the request body was cut off or did not arrive in time\n",
            ));
        };
        if bytes.len() + data.len() > limit {
            return closing(text(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("the request body is over {limit} bytes (--max-request-bytes)\n"),
            ));
        }
        if let Err(share) = held.grow_to(bytes.len() + data.len()) {
            return refused(share);
        }
        bytes.extend_from_slice(&data);
    }
    // Arrived whole: parsed next, no longer counted.
    drop(held);
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}
