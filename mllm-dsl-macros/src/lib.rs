//! The `#[module]` attribute of mllm-dsl.
//!
//! On a struct it implements `mllm_dsl::Module`: every field whose type is not a plain config type
//! (numbers, `bool`, `String`, ...) is a child module or layer, named after the field
//! (`#[module(rename = "input_layernorm")]` overrides the name, `#[module(skip)]` marks a config
//! field of another type). Binding walks the fields in order, so paths equal PyTorch's module paths.
//!
//! On an `impl` block (inherent, or a trait impl such as `impl DecoderAttention for LlamaAttention`)
//! it wraps each `forward` and `forward_*` method so that a call enters the module's scope: under
//! tracing the call records a `graph.SubGraphOp`, and `qdq!` inside it knows its module path.
//!
//! Generated code refers to the runtime only through `::mllm_dsl::__private` (or the path given with
//! `#[module(crate = path)]`). All attribute errors are collected and reported together, each
//! spanned at the offending tokens.

mod ctxt;
mod expand;

use proc_macro::TokenStream;

#[proc_macro_attribute]
pub fn module(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::module(attr.into(), item.into()).into()
}
