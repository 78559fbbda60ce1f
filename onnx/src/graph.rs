//! Iconq+'s weights ([`IconqWeights`]) as an ONNX graph, opset 17.
//!
//! Inputs, with `batch` rows and the sequences time-major (ONNX LSTM's
//! default layout), padded to the longest row:
//!
//! | name | type | shape |
//! |---|---|---|
//! | `before` | float | `[before_steps, batch, FEATURES]` |
//! | `before_lens` | int32 | `[batch]` |
//! | `after` | float | `[after_steps, batch, FEATURES]` |
//! | `after_lens` | int32 | `[batch]` |
//! | `target` | float | `[batch, TARGET_FEATURES]` |
//! | `context` | float | `[batch, CONTEXT_FEATURES]` |
//!
//! Outputs: `residual` (`[batch, 1]`, `ln(latency / base)`, what
//! [`IconqWeights::head`] gives) and both LSTMs' final states,
//! `before_h`, `before_c`, `after_h`, `after_c` (`[batch, H]`), which
//! core's native step continues from when a later neighbour arrives.
//!
//! The weights are stored in PyTorch's gate order (i, f, g, o); ONNX's
//! LSTM reads (i, o, f, c), so [`onnx_gate_order`] moves the blocks.
//!
//! # Properties
//!
//! - (A) The graph computes what core's native pass computes, to float
//!   rounding (the runtime's tests hold it to 1e-5 on every output).
//! - (B) [`iconq_model`] is a pure function of the weights: the same
//!   weights give the same bytes.

use slogate_core::predict::iconq::{CONTEXT_FEATURES, FEATURE_SCHEMA_VERSION, FEATURES, IconqWeights, Lstm, TARGET_FEATURES};

use crate::Error;
use crate::proto::{
    AttributeProto, Dimension, DimensionValue, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto, TensorShapeProto,
    TensorTypeProto, TypeProto, ValueInfoProto, attribute_type, data_type,
};

/// The ONNX IR version the model is written in.
pub const IR_VERSION: i64 = 8;
/// The `ai.onnx` operator set it uses.
pub const OPSET: i64 = 17;

/// The graph's input names, in order.
pub const INPUTS: [&str; 6] = ["before", "before_lens", "after", "after_lens", "target", "context"];
/// The graph's output names, in order.
pub const OUTPUTS: [&str; 5] = ["residual", "before_h", "before_c", "after_h", "after_c"];

/// The metadata key that holds the feature schema's version.
pub const SCHEMA_KEY: &str = "slogate.feature_schema_version";
/// The metadata key that holds the neighbours read per side.
pub const NEIGHBOURS_MAX_KEY: &str = "slogate.neighbours_max";

/// A weight matrix's rows moved from PyTorch's gate order (i, f, g, o) to
/// ONNX's (i, o, f, c): `rows` holds four blocks of `block` values each.
pub fn onnx_gate_order(rows: &[f32], block: usize) -> Vec<f32> {
    [0, 3, 1, 2].iter().flat_map(|&gate| rows[gate * block..(gate + 1) * block].iter().copied()).collect()
}

/// The model's bytes (a serialised `ModelProto`).
pub fn iconq_model_bytes(weights: &IconqWeights) -> Result<Vec<u8>, Error> {
    Ok(prost::Message::encode_to_vec(&iconq_model(weights)?))
}

/// The model; fails on weights whose shapes are wrong.
pub fn iconq_model(weights: &IconqWeights) -> Result<ModelProto, Error> {
    weights.check().map_err(Error::Weights)?;
    let mut initializer = Vec::new();
    let mut node = Vec::new();
    for (side, lstm) in [("before", &weights.before), ("after", &weights.after)] {
        lstm_nodes(side, lstm, &mut node, &mut initializer);
    }
    let head_inputs = weights.before.hidden + weights.after.hidden + TARGET_FEATURES + CONTEXT_FEATURES;
    let width = weights.hidden.width;
    initializer.push(floats("hidden_w", &[width, head_inputs], weights.hidden.w.clone()));
    initializer.push(floats("hidden_b", &[width], weights.hidden.b.clone()));
    initializer.push(floats("out_w", &[1, width], weights.out.w.clone()));
    initializer.push(floats("out_b", &[1], vec![weights.out.b]));
    node.push(op("Concat", &["before_h", "after_h", "target", "context"], &["head_in"], vec![int("axis", 1)]));
    node.push(op("Gemm", &["head_in", "hidden_w", "hidden_b"], &["hidden_pre"], vec![int("transB", 1)]));
    node.push(op("Relu", &["hidden_pre"], &["hidden_out"], vec![]));
    node.push(op("Gemm", &["hidden_out", "out_w", "out_b"], &["residual"], vec![int("transB", 1)]));

    let batch = || Dim::Named("batch");
    let input = vec![
        value("before", data_type::FLOAT, &[Dim::Named("before_steps"), batch(), Dim::Fixed(FEATURES)]),
        value("before_lens", data_type::INT32, &[batch()]),
        value("after", data_type::FLOAT, &[Dim::Named("after_steps"), batch(), Dim::Fixed(FEATURES)]),
        value("after_lens", data_type::INT32, &[batch()]),
        value("target", data_type::FLOAT, &[batch(), Dim::Fixed(TARGET_FEATURES)]),
        value("context", data_type::FLOAT, &[batch(), Dim::Fixed(CONTEXT_FEATURES)]),
    ];
    let output = vec![
        value("residual", data_type::FLOAT, &[batch(), Dim::Fixed(1)]),
        value("before_h", data_type::FLOAT, &[batch(), Dim::Fixed(weights.before.hidden)]),
        value("before_c", data_type::FLOAT, &[batch(), Dim::Fixed(weights.before.hidden)]),
        value("after_h", data_type::FLOAT, &[batch(), Dim::Fixed(weights.after.hidden)]),
        value("after_c", data_type::FLOAT, &[batch(), Dim::Fixed(weights.after.hidden)]),
    ];
    let metadata = [(SCHEMA_KEY, FEATURE_SCHEMA_VERSION.to_string()), (NEIGHBOURS_MAX_KEY, weights.neighbours_max.to_string())];
    Ok(ModelProto {
        ir_version: IR_VERSION,
        producer_name: "slogate".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        model_version: 1,
        doc_string: "Iconq+ (AutoSLO §4): ln(latency / base prediction) from LSTMs over a query's neighbours before and after its arrival.".into(),
        graph: Some(GraphProto { node, name: "iconq_plus".into(), initializer, input, output }),
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: OPSET }],
        metadata_props: metadata.into_iter().map(|(key, value)| StringStringEntryProto { key: key.into(), value }).collect(),
    })
}

/// One side's LSTM: `{side}` and `{side}_lens` in, `{side}_h` and
/// `{side}_c` (`[batch, H]`) out.
fn lstm_nodes(side: &str, lstm: &Lstm, node: &mut Vec<NodeProto>, initializer: &mut Vec<TensorProto>) {
    let (hidden, input) = (lstm.hidden, lstm.input);
    let name = |suffix: &str| format!("{side}_{suffix}");
    let mut bias = onnx_gate_order(&lstm.b_ih, hidden);
    bias.extend(onnx_gate_order(&lstm.b_hh, hidden));
    initializer.push(floats(&name("W"), &[1, 4 * hidden, input], onnx_gate_order(&lstm.w_ih, hidden * input)));
    initializer.push(floats(&name("R"), &[1, 4 * hidden, hidden], onnx_gate_order(&lstm.w_hh, hidden * hidden)));
    initializer.push(floats(&name("B"), &[1, 8 * hidden], bias));
    if !initializer.iter().any(|t| t.name == "axis_0") {
        initializer.push(TensorProto { dims: vec![1], data_type: data_type::INT64, int64_data: vec![0], name: "axis_0".into(), ..Default::default() });
    }
    let (w, r, b, lens) = (name("W"), name("R"), name("B"), name("lens"));
    let (h3, c3) = (name("h_3d"), name("c_3d"));
    node.push(op("LSTM", &[side, &w, &r, &b, &lens], &["", &h3, &c3], vec![int("hidden_size", hidden as i64)]));
    node.push(op("Squeeze", &[&h3, "axis_0"], &[&name("h")], vec![]));
    node.push(op("Squeeze", &[&c3, "axis_0"], &[&name("c")], vec![]));
}

/// One row for the graph: a target's features, the context and its
/// neighbours' interaction vectors before and after it (already clipped to
/// the model's `neighbours_max`, chronological).
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    /// [`slogate_core::predict::iconq::target_features`].
    pub target: [f32; TARGET_FEATURES],
    /// [`slogate_core::predict::iconq::context_features`].
    pub context: [f32; CONTEXT_FEATURES],
    /// The neighbours before it.
    pub before: &'a [[f32; FEATURES]],
    /// The neighbours after it.
    pub after: &'a [[f32; FEATURES]],
}

/// Rows packed as the graph's inputs: each sequence padded with zeros to
/// the longest of its side (at least one step: ONNX Runtime refuses an
/// empty time axis; a row's `lens` say how much of it is real, and a row
/// of length 0 reads as the zero state).
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Rows.
    pub rows: usize,
    /// `before`'s time steps.
    pub before_steps: usize,
    /// `[before_steps, rows, FEATURES]`.
    pub before: Vec<f32>,
    /// `[rows]`.
    pub before_lens: Vec<i32>,
    /// `after`'s time steps.
    pub after_steps: usize,
    /// `[after_steps, rows, FEATURES]`.
    pub after: Vec<f32>,
    /// `[rows]`.
    pub after_lens: Vec<i32>,
    /// `[rows, TARGET_FEATURES]`.
    pub target: Vec<f32>,
    /// `[rows, CONTEXT_FEATURES]`.
    pub context: Vec<f32>,
}

impl Batch {
    /// Packs `rows`.
    pub fn pack(rows: &[Row<'_>]) -> Batch {
        let before: Vec<&[[f32; FEATURES]]> = rows.iter().map(|r| r.before).collect();
        let after: Vec<&[[f32; FEATURES]]> = rows.iter().map(|r| r.after).collect();
        let (before_steps, before, before_lens) = time_major(&before);
        let (after_steps, after, after_lens) = time_major(&after);
        Batch {
            rows: rows.len(),
            before_steps,
            before,
            before_lens,
            after_steps,
            after,
            after_lens,
            target: rows.iter().flat_map(|r| r.target).collect(),
            context: rows.iter().flat_map(|r| r.context).collect(),
        }
    }
}

/// Sequences packed time-major, padded to the longest (at least one step),
/// with their lengths.
fn time_major(sequences: &[&[[f32; FEATURES]]]) -> (usize, Vec<f32>, Vec<i32>) {
    let rows = sequences.len();
    let steps = sequences.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
    let mut values = vec![0.0; steps * rows * FEATURES];
    for (row, sequence) in sequences.iter().enumerate() {
        for (step, vector) in sequence.iter().enumerate() {
            let at = (step * rows + row) * FEATURES;
            values[at..at + FEATURES].copy_from_slice(vector);
        }
    }
    (steps, values, sequences.iter().map(|s| s.len() as i32).collect())
}

enum Dim {
    Fixed(usize),
    Named(&'static str),
}

fn value(name: &str, elem_type: i32, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => DimensionValue::DimValue(*n as i64),
                Dim::Named(p) => DimensionValue::DimParam((*p).into()),
            }),
        })
        .collect();
    ValueInfoProto { name: name.into(), r#type: Some(TypeProto { tensor_type: Some(TensorTypeProto { elem_type, shape: Some(TensorShapeProto { dim }) }) }) }
}

fn floats(name: &str, dims: &[usize], values: Vec<f32>) -> TensorProto {
    TensorProto { dims: dims.iter().map(|&d| d as i64).collect(), data_type: data_type::FLOAT, float_data: values, name: name.into(), ..Default::default() }
}

fn op(op_type: &str, input: &[&str], output: &[&str], attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: input.iter().map(|s| (*s).to_string()).collect(),
        output: output.iter().map(|s| (*s).to_string()).collect(),
        name: format!("{op_type}_{}", output.iter().find(|s| !s.is_empty()).copied().unwrap_or_default()),
        op_type: op_type.into(),
        attribute,
    }
}

fn int(name: &str, value: i64) -> AttributeProto {
    AttributeProto { name: name.into(), i: value, r#type: attribute_type::INT }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_order_moves_pytorch_ifgo_blocks_to_onnx_iofc() {
        let rows: Vec<f32> = [1.0, 2.0, 3.0, 4.0].iter().flat_map(|&g| [g, g]).collect();
        assert_eq!(onnx_gate_order(&rows, 2), vec![1.0, 1.0, 4.0, 4.0, 2.0, 2.0, 3.0, 3.0]);
    }
}
