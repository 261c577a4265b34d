//! `qdq!`: one macro for every kind of QDQ point in mllm's models.
//!
//! | form | mllm helper | meaning |
//! |---|---|---|
//! | `qdq!(x, "up_proj_input_qdq")` | `ptq::QDQ` | activation, uint16 asymmetric |
//! | `qdq!(kv k, "k_cast_to_int8_qdq")` | `ptq::QDQ_KV` | KV cache, uint8 with zero point 128 |
//! | `qdq!(fixed s, "sigmoid_output_qdq", scale = 1.0 / 65536.0, zp = 0)` | `FixedActivationQDQ` | fixed parameters |
//! | `qdq!(const 0.125, "scaling_qdq")` | `Tensor::constant` + `ptq::QDQ` | a scalar constant with its own QDQ |
//! | `qdq!(rope table, "sin_embedding_input_qdq")` | `ptq::QDQ_ROPE` | RoPE tables |
//! | `qdq!(global const 0.0, "constant_zero", scale = s, zp = z)` | `ptq::QDQ_CONSTANT` | top-level key, compile-time parameters |
//!
//! Names resolve against the module whose `forward` is running: in `model.layers.0.mlp`,
//! `"up_proj_input_qdq"` is the checkpoint key `model.layers.0.mlp.up_proj_input_qdq`. Each form
//! evaluates to `Result<Tensor>`; in float mode it is the identity, under tracing it annotates the value.

/// A QDQ point. See the [module docs](crate::macros) for the forms.
#[macro_export]
macro_rules! qdq {
    (kv $x:expr, $name:expr $(,)?) => {
        $crate::__private::qdq(&$x, $name, $crate::QdqKind::KvCache)
    };
    (fixed $x:expr, $name:expr, scale = $s:expr, zp = $z:expr $(,)?) => {
        $crate::__private::qdq(&$x, $name, $crate::QdqKind::Fixed { scale: $s, zero_point: $z })
    };
    (global const $v:expr, $name:expr, scale = $s:expr, zp = $z:expr $(,)?) => {
        $crate::__private::qdq(
            &$crate::Tensor::scalar($v),
            $name,
            $crate::QdqKind::Global { scale: $s, zero_point: $z },
        )
    };
    (const $v:expr, $name:expr $(,)?) => {
        $crate::__private::qdq(&$crate::Tensor::scalar($v), $name, $crate::QdqKind::Constant)
    };
    (rope $x:expr, $name:expr $(,)?) => {
        $crate::__private::qdq(&$x, $name, $crate::QdqKind::Rope)
    };
    ($x:expr, $name:expr $(,)?) => {
        $crate::__private::qdq(&$x, $name, $crate::QdqKind::Activation)
    };
}
