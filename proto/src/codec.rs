//! The Gateway's codec: prost's, except that a request that does not
//! decode is the client's error, INVALID_ARGUMENT, where gRPC libraries
//! answer INTERNAL. A client (or a proxy's alert) then tells a malformed
//! request from a fault in the node.

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder};

/// See the module docs.
#[derive(Debug, Clone)]
pub struct GatewayCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for GatewayCodec<T, U> {
    fn default() -> Self {
        GatewayCodec { inner: ProstCodec::default() }
    }
}

impl<T, U> Codec for GatewayCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = InvalidArgumentDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        InvalidArgumentDecoder { inner: self.inner.decoder() }
    }
}

/// Prost's decoder, with decode errors as INVALID_ARGUMENT.
#[derive(Debug)]
pub struct InvalidArgumentDecoder<U> {
    inner: ProstDecoder<U>,
}

impl<U: Message + Default + Send + 'static> Decoder for InvalidArgumentDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(buf).map_err(|status| Status::invalid_argument(format!("the request does not decode: {}", status.message())))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}
