// `#[module]` on a trait impl: a model file writes its attention directly as the trait the decoder
// skeleton calls. `forward` and `forward_*` methods are scopes; other methods (constructors) are left
// alone.
use mllm_dsl::prelude::*;

trait Block: Module + Sized {
    fn new(width: usize) -> Self;
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    fn forward_twice(&self, x: &Tensor) -> Result<Tensor>;
}

#[module]
struct Mlp {
    up_proj: Conv2d,
}

#[module]
impl Block for Mlp {
    fn new(width: usize) -> Self {
        Mlp { up_proj: Conv2d::new(width, width) }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = qdq!(x, "up_proj_input_qdq")?;
        self.up_proj.forward(&x)
    }

    fn forward_twice(&self, x: &Tensor) -> Result<Tensor> {
        let y = qdq!(x, "twice_input_qdq")?;
        self.up_proj.forward(&self.up_proj.forward(&y)?)
    }
}

#[module]
struct Model<B: Block> {
    mlp: B,
}

#[module]
impl<B: Block> Model<B> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.mlp.forward_twice(&self.mlp.forward(x)?)
    }
}

fn main() {
    let mut model = Model { mlp: <Mlp as Block>::new(8) };
    model.bind("model", &ParamSource::Symbolic(ParamFormat::Float)).unwrap();
    let input = TraceInput::new("x", [1, 1, 4, 8], DType::F32);
    let program = trace(&[input], |t| model.forward(&t[0])).unwrap();
    let text = program.to_string();
    for needle in [
        "graph.SubGraphOp @model.mlp CPU",
        "qdq:act(\"model.mlp.up_proj_input_qdq\")",
        "qdq:act(\"model.mlp.twice_input_qdq\")",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from\n{text}");
    }
}
