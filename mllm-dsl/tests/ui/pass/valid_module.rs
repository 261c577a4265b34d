// A valid module tree: renamed, skipped and config fields, a raw identifier, a generic child, a tuple
// output, and `#[module(crate = ...)]`.
use mllm_dsl::prelude::*;
use std::collections::HashMap;
use std::marker::PhantomData;

/// A layer this model can be generic over.
trait Layer: Module {
    fn run(&self, x: &Tensor) -> Result<Tensor>;
}

impl Layer for Conv2d {
    fn run(&self, x: &Tensor) -> Result<Tensor> {
        self.forward(x)
    }
}

#[module]
struct Mlp<L: Layer> {
    #[module(rename = "up_proj")]
    up: L,
    r#type: Conv2d,
    #[module(skip)]
    notes: HashMap<String, usize>,
    hidden: usize,
    marker: PhantomData<L>,
}

#[module]
impl<L: Layer> Mlp<L> {
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let x = qdq!(x, "up_proj_input_qdq")?;
        let up = self.up.run(&x)?;
        Ok((up.silu()?, self.r#type.forward(&x)?))
    }
}

#[module(crate = ::mllm_dsl)]
struct Model {
    layers: ModuleList<Mlp<Conv2d>>,
}

#[module(crate = ::mllm_dsl)]
impl Model {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (a, b) = self.layers[0].forward(x)?;
        a.add(&b)
    }
}

fn main() {
    let mlp = || Mlp {
        up: Conv2d::new(8, 16),
        r#type: Conv2d::new(8, 16),
        notes: HashMap::new(),
        hidden: 8,
        marker: PhantomData,
    };
    let mut model = Model { layers: ModuleList::new(vec![mlp()]) };
    model.bind("model", &ParamSource::Symbolic(ParamFormat::Float)).unwrap();
    assert_eq!(model.module_path().as_deref(), Some("model"));
    assert_eq!(model.layers[0].module_path().as_deref(), Some("model.layers.0"));
    assert!(model.layers[0].notes.is_empty() && model.layers[0].hidden == 8);
    let _ = &model.layers[0].marker;

    let input = TraceInput::new("x", [1, 1, 4, 8], DType::F32);
    let program = trace(&[input], |t| model.forward(&t[0])).unwrap();
    let text = program.to_string();
    for needle in [
        "graph.SubGraphOp @model.layers.0 CPU",
        "<name=\"model.layers.0.up_proj\">",
        "<name=\"model.layers.0.type\">",
        "[@model.layers.0.up_proj.weight]",
        "qdq:act(\"model.layers.0.up_proj_input_qdq\")",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from\n{text}");
    }
    assert!(!text.contains("notes") && !text.contains("hidden"));
}
