//! The reference interpreter on the attention-like example graph: masking, KV concatenation and
//! softmax normalisation hold in the integer domain.

mod common;

use backend_qnn::interp::{Interpreter, TensorValue};
use common::{HIDDEN, PAST, SEQ};

#[test]
fn masked_attention_in_the_integer_domain() {
    let g = common::tiny_attention("tiny_attention");
    let it = Interpreter::new(&g).unwrap();
    let ctx = (PAST + SEQ) as usize;
    // Causal mask: past columns attend; in the current block row r sees columns PAST..=PAST+r.
    let mask: Vec<f32> = (0..SEQ as usize * ctx)
        .map(|i| {
            let (r, c) = (i / ctx, i % ctx);
            if c < PAST as usize || c - (PAST as usize) <= r {
                0.0
            } else {
                -0.001
            }
        })
        .collect();
    let past: Vec<f32> = common::pseudo((HIDDEN * PAST) as usize, 7).iter().map(|v| v * 2.0).collect();
    let inputs = vec![
        it.input_from_real(0, &[3.0, 7.0, 1.0, 15.0]).unwrap(),
        it.input_from_real(1, &[4.0, 5.0, 6.0, 7.0]).unwrap(),
        it.input_from_real(2, &mask).unwrap(),
        it.input_from_real(3, &past).unwrap(),
        it.input_from_real(4, &past).unwrap(),
    ];
    assert_eq!(inputs[2].codes().unwrap()[..ctx].iter().filter(|&&c| c == 65535).count(), PAST as usize + 1);
    let all = it.run_all(&inputs).unwrap();

    // Masked scores are replaced and get (numerically) zero probability; rows sum to one.
    let probs = all["probs"].codes().unwrap();
    let attend = all["attend"].codes().unwrap();
    for r in 0..SEQ as usize {
        let row = &probs[r * ctx..(r + 1) * ctx];
        let sum: i64 = row.iter().sum();
        assert!((sum - 65535).abs() <= ctx as i64, "row {r} sums to {sum}");
        for c in 0..ctx {
            assert_eq!(attend[r * ctx + c] == 1, mask[r * ctx + c] == 0.0);
            if attend[r * ctx + c] == 0 {
                assert_eq!(row[c], 0, "masked probability at ({r}, {c})");
            }
        }
    }
    // KV concatenation moves uint8 codes untouched: past first, then the new entries.
    let (k_all, past_k, present_k) =
        (all["k_all"].codes().unwrap(), all["past_key"].codes().unwrap(), all["present_key"].codes().unwrap());
    for d in 0..HIDDEN as usize {
        assert_eq!(&k_all[d * ctx..d * ctx + PAST as usize], &past_k[d * PAST as usize..(d + 1) * PAST as usize]);
        assert_eq!(
            &k_all[d * ctx + PAST as usize..(d + 1) * ctx],
            &present_k[d * SEQ as usize..(d + 1) * SEQ as usize]
        );
    }
    // Outputs come back in binding order and a second run is identical.
    let outputs = it.run(&inputs).unwrap();
    let names: Vec<&str> = g.outputs.iter().map(String::as_str).collect();
    assert_eq!(names, ["present_key", "present_value", "logits"]);
    assert_eq!(outputs[2].dims, vec![SEQ, common::VOCAB]);
    assert_eq!(outputs, it.run(&inputs).unwrap());
    assert_eq!(outputs[0], all["present_key"]);
    let logits: &TensorValue = &outputs[2];
    assert!(logits.to_real().unwrap().iter().all(|v| v.is_finite()));
}
