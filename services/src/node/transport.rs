//! The gRPC listener's connections: what a client cannot hold open.
//!
//! [`incoming`] accepts on the node's gRPC listener and hands tonic
//! [`Connection`]s:
//!
//! - at most `connections_max` are open at once; beyond that the accept
//!   loop waits for one to close (the kernel's backlog queues the rest, then
//!   refuses them), so a flood of sockets costs no file descriptors past the
//!   limit;
//! - each has TCP_NODELAY set, and takes plain writes, not vectored ones
//!   (so h2 batches the replies ready at once into one write; see
//!   [`Connection`]'s `is_write_vectored`);
//! - an accept error (EMFILE, ENFILE, ENOBUFS) backs off from 5 ms,
//!   doubling to 1 s, instead of retrying at once, and is logged once per
//!   streak;
//! - a connection that sends nothing within `handshake_timeout` of being
//!   accepted is closed;
//! - a connection with no open stream for `idle_timeout` is closed (the
//!   check runs at least every quarter of `idle_timeout` while streams are
//!   open, so it closes within 1.25 × `idle_timeout` of its last stream);
//! - [`Connections::close_all`] closes every one at once: the shutdown's
//!   hard deadline.
//!
//! [`StreamTrackingLayer`] counts each connection's open streams: a request
//! is open from its headers until its response body ends or is dropped.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::TlsConnectInfo;

/// A connection's info from a request's extensions, over TLS or not.
pub fn connection_info(extensions: &tonic::Extensions) -> Option<&ConnectionInfo> {
    extensions.get::<ConnectionInfo>().or_else(|| extensions.get::<TlsConnectInfo<ConnectionInfo>>().map(TlsConnectInfo::get_ref))
}

/// The listener's limits (`[limits]` in the node's config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportLimits {
    /// Connections open at once at most.
    pub connections_max: usize,
    /// A connection must send its first byte within this.
    pub handshake_timeout: Duration,
    /// A connection with no open stream for this long is closed.
    pub idle_timeout: Duration,
}

/// The first backoff after an accept error, and the longest.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The open connections, shared by the accept loop and the shutdown.
#[derive(Clone, Debug)]
pub struct Connections {
    slots: Arc<Semaphore>,
    connections_max: usize,
    close: watch::Sender<bool>,
}

impl Connections {
    /// Room for `connections_max` connections.
    pub fn new(connections_max: usize) -> Self {
        Connections { slots: Arc::new(Semaphore::new(connections_max)), connections_max, close: watch::channel(false).0 }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.connections_max - self.slots.available_permits()
    }

    /// Closes every open connection, and every one accepted from now on.
    pub fn close_all(&self) {
        self.close.send_replace(true);
    }
}

/// Accepts on `listener` under `limits` until the returned stream is
/// dropped (tonic drops it when the server stops).
pub fn incoming(listener: TcpListener, limits: TransportLimits, connections: Connections) -> tokio_stream::wrappers::ReceiverStream<io::Result<Connection>> {
    let (sender, receiver) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut backoff = ACCEPT_BACKOFF_MIN;
        let mut failing = false;
        loop {
            let permit = tokio::select! {
                permit = Arc::clone(&connections.slots).acquire_owned() => permit.expect("the semaphore is never closed"),
                () = sender.closed() => return,
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = sender.closed() => return,
            };
            match accepted {
                Ok((stream, peer)) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    failing = false;
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::debug!(message = "Cannot set TCP_NODELAY.", %peer, %error);
                    }
                    let connection = Connection::new(stream, peer, limits, permit, connections.close.subscribe());
                    if sender.send(Ok(connection)).await.is_err() {
                        return;
                    }
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(message = "Accepting a gRPC connection failed; backing off.", %error, open = connections.open());
                        failing = true;
                    }
                    drop(permit);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

/// One connection's open streams.
#[derive(Debug)]
struct Activity {
    open_streams: AtomicUsize,
    /// When the last stream closed (or the connection opened).
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn open(self: &Arc<Self>) -> StreamGuard {
        self.open_streams.fetch_add(1, Ordering::Relaxed);
        StreamGuard { activity: Arc::clone(self) }
    }

    fn idle_since(&self) -> Option<Instant> {
        let idle_since = self.idle_since.lock().expect("the idle clock's lock is never poisoned");
        (self.open_streams.load(Ordering::Relaxed) == 0).then_some(*idle_since)
    }
}

/// Holds a stream open on its connection until dropped.
#[derive(Debug)]
pub struct StreamGuard {
    activity: Arc<Activity>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut idle_since = self.activity.idle_since.lock().expect("the idle clock's lock is never poisoned");
        if self.activity.open_streams.fetch_sub(1, Ordering::Relaxed) == 1 {
            *idle_since = Instant::now();
        }
    }
}

/// What a request knows of its connection (a request extension).
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    /// The peer.
    pub remote: SocketAddr,
    activity: Arc<Activity>,
}

/// An accepted connection under the listener's limits.
pub struct Connection {
    stream: TcpStream,
    info: ConnectionInfo,
    limits: TransportLimits,
    accepted: Instant,
    seen_bytes: bool,
    timer: Pin<Box<Sleep>>,
    closing: Pin<Box<dyn Future<Output = ()> + Send>>,
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    fn new(stream: TcpStream, remote: SocketAddr, limits: TransportLimits, slot: OwnedSemaphorePermit, mut close: watch::Receiver<bool>) -> Self {
        let accepted = Instant::now();
        let activity = Arc::new(Activity { open_streams: AtomicUsize::new(0), idle_since: Mutex::new(accepted) });
        let closing = Box::pin(async move {
            // Resolves once `close_all` runs (or the node is gone).
            let _ = close.wait_for(|closed| *closed).await;
        });
        Connection {
            stream,
            info: ConnectionInfo { remote, activity },
            limits,
            accepted,
            seen_bytes: false,
            timer: Box::pin(tokio::time::sleep_until(accepted + limits.handshake_timeout)),
            closing,
            _slot: slot,
        }
    }

    /// When the connection must next be looked at, and whether that time
    /// has come with nothing to keep it open.
    fn deadline(&self, now: Instant) -> (Instant, bool) {
        if !self.seen_bytes {
            let at = self.accepted + self.limits.handshake_timeout;
            return (at, now >= at);
        }
        match self.info.activity.idle_since() {
            Some(since) => {
                let at = since + self.limits.idle_timeout;
                (at, now >= at)
            }
            None => (now + self.limits.idle_timeout / 4, false),
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.closing.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the node closed every connection at its shutdown deadline")));
        }
        let before = buf.filled().len();
        if let Poll::Ready(result) = Pin::new(&mut this.stream).poll_read(cx, buf) {
            this.seen_bytes |= buf.filled().len() > before;
            return Poll::Ready(result);
        }
        loop {
            let (at, expired) = this.deadline(Instant::now());
            if expired {
                // End of stream: the HTTP/2 connection ends with no stream
                // to lose.
                tracing::debug!(message = "Closing a gRPC connection.", remote = %this.info.remote, handshake = !this.seen_bytes);
                return Poll::Ready(Ok(()));
            }
            // A timer due no later than `at` is kept: when it fires, the
            // loop looks again. Re-armed on every pending read, it cost a
            // timer-wheel update a read.
            let armed = this.timer.deadline();
            if armed > at || this.timer.is_elapsed() {
                this.timer.as_mut().reset(at);
            }
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    /// Not vectored, on purpose: h2 then copies a DATA frame under 1 KiB
    /// into its write buffer with the frames around it, where with vectored
    /// writes it keeps any payload of 256 bytes or more apart and must
    /// write it out before it encodes the next frame. A Submit's reply
    /// with its explanation is about 300 bytes, so with vectored writes
    /// every reply took a `writev` of its own (one a query, at 25k
    /// queries/s); copied, the replies ready at once leave in one write.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info.clone()
    }
}

/// Counts open streams per connection (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamTrackingLayer;

impl<S> tower::Layer<S> for StreamTrackingLayer {
    type Service = StreamTracking<S>;

    fn layer(&self, inner: S) -> StreamTracking<S> {
        StreamTracking { inner }
    }
}

/// See [`StreamTrackingLayer`].
#[derive(Clone, Debug)]
pub struct StreamTracking<S> {
    inner: S,
}

impl<S, RequestBody, ResponseBody> tower::Service<http::Request<RequestBody>> for StreamTracking<S>
where
    S: tower::Service<http::Request<RequestBody>, Response = http::Response<ResponseBody>>,
    S::Future: Send + 'static,
    ResponseBody: Send + 'static,
{
    type Response = http::Response<TrackedBody<ResponseBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        let extensions = request.extensions();
        let info = extensions.get::<ConnectionInfo>().or_else(|| extensions.get::<TlsConnectInfo<ConnectionInfo>>().map(TlsConnectInfo::get_ref));
        let guard = info.map(|info| info.activity.open());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| TrackedBody { body, _guard: guard }))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that holds its stream open until it ends.
    pub struct TrackedBody<B> {
        #[pin]
        body: B,
        _guard: Option<StreamGuard>,
    }
}

impl<B: http_body::Body> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt as _;

    use super::*;

    #[tokio::test]
    async fn every_accepted_connection_has_tcp_nodelay_set_and_takes_plain_writes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let limits = TransportLimits { connections_max: 4, handshake_timeout: Duration::from_secs(5), idle_timeout: Duration::from_secs(5) };
        let mut accepted = incoming(listener, limits, Connections::new(4));
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(address).await.unwrap());
            let connection = accepted.next().await.expect("the accept loop runs").expect("accepted");
            assert!(connection.stream.nodelay().unwrap(), "Nagle's algorithm is off on the node's side");
            assert!(!connection.is_write_vectored(), "h2 batches the replies under 1 KiB into one write only on a connection that is not vectored");
        }
    }
}
