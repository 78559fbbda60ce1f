//! The part of the ONNX protobuf (`onnx/onnx.proto`, IR version 8) that
//! the Iconq+ graph uses, as prost messages. Field numbers are ONNX's;
//! a field this graph never writes is left out (protobuf readers skip
//! what they don't know, and an absent field reads as its default).

/// `TensorProto.DataType`.
pub mod data_type {
    /// 32-bit float.
    pub const FLOAT: i32 = 1;
    /// 32-bit signed integer.
    pub const INT32: i32 = 6;
    /// 64-bit signed integer.
    pub const INT64: i32 = 7;
}

/// `AttributeProto.AttributeType`.
pub mod attribute_type {
    /// One integer.
    pub const INT: i32 = 2;
}

/// `ModelProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// The IR version the model is written in.
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// Who wrote it.
    #[prost(string, tag = "2")]
    pub producer_name: String,
    /// Its version.
    #[prost(string, tag = "3")]
    pub producer_version: String,
    /// The model's own version.
    #[prost(int64, tag = "5")]
    pub model_version: i64,
    /// A description.
    #[prost(string, tag = "6")]
    pub doc_string: String,
    /// The graph.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    /// The operator sets the graph uses.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// Free-form metadata.
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// `OperatorSetIdProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// Empty for the default `ai.onnx` domain.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The opset version.
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// `StringStringEntryProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    /// Key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `GraphProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// The nodes, in topological order.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// The graph's name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Constant tensors (the weights).
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// The graph's inputs.
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// The graph's outputs.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
}

/// `NodeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// Input names (an empty name skips an optional input).
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// Output names (an empty name skips an optional output).
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// The node's name.
    #[prost(string, tag = "3")]
    pub name: String,
    /// The operator.
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// Its attributes.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `AttributeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// The attribute's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// An integer value.
    #[prost(int64, tag = "3")]
    pub i: i64,
    /// Which of the values it holds ([`attribute_type`]).
    #[prost(int32, tag = "20")]
    pub r#type: i32,
}

/// `TensorProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// Its shape.
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// Its element type ([`data_type`]).
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// Float elements, row-major.
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// 64-bit integer elements.
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    /// Its name (an initializer's is what nodes read).
    #[prost(string, tag = "8")]
    pub name: String,
}

/// `ValueInfoProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// The value's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its type.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `TypeProto`, tensors only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// A tensor type (`TypeProto.value`'s `tensor_type` arm).
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TensorTypeProto>,
}

/// `TypeProto.Tensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorTypeProto {
    /// Its element type ([`data_type`]).
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    /// Its shape.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `TensorShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// The dimensions.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    /// A fixed size or a named, dynamic one.
    #[prost(oneof = "DimensionValue", tags = "1, 2")]
    pub value: Option<DimensionValue>,
}

/// `TensorShapeProto.Dimension.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum DimensionValue {
    /// A fixed size.
    #[prost(int64, tag = "1")]
    DimValue(i64),
    /// A named dynamic size.
    #[prost(string, tag = "2")]
    DimParam(String),
}
