//! SmolLM2-135M-Instruct, converted from its GGUF by the project's own code (`scripts/fetch-smollm2`),
//! against HF transformers (fixtures/smollm2, see fixtures/PROVENANCE.md): token ids through our
//! tokenizer.json, the chat template through checkpoint::ChatTemplate, float logits within 2e-4 of
//! HF's full rows at the selected positions and, at every position of every case, of HF's per-row
//! summary (argmax, logsumexp over the vocabulary, the logits of HF's 8 largest ids), greedy
//! continuations identical.
//!
//! The converted directory is `$MLLM_DSL_SMOLLM2_DIR`, else `$MLLM_DSL_CACHE/smollm2-135m-instruct-hf`
//! (cache default `~/.cache/mllm-dsl`). Without it the test fails, naming the script that makes it.

use aot::load_float;
use checkpoint::{ChatMessage, ChatTemplate, SafetensorsCheckpoint};
use runtime::{GenerationConfig, Generator, Sampling};
use std::path::{Path, PathBuf};

/// The example's own source: the chat tests run its `run_generate_io` on parsed arguments.
#[allow(dead_code)]
#[path = "../generate.rs"]
mod generate;

const TOLERANCE: f32 = 2e-4;
const CONTEXT: usize = 128;
const CASES: [&str; 4] = ["plain", "digits", "chat", "passage"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/smollm2")
}

fn model_dir() -> PathBuf {
    aot::smollm2_dir().unwrap_or_else(|e| panic!("{e:#}"))
}

fn reference() -> SafetensorsCheckpoint {
    SafetensorsCheckpoint::open_file(fixtures().join("reference.safetensors")).unwrap()
}

fn ids(r: &SafetensorsCheckpoint, key: &str) -> Vec<u32> {
    r.read_i64(key).unwrap().into_iter().map(|v| v as u32).collect()
}

fn tokenizer(dir: &Path) -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
}

fn encode(tok: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, false).unwrap().get_ids().to_vec()
}

#[test]
fn tokenizer_and_chat_template_match_hf() {
    let dir = model_dir();
    let tok = tokenizer(&dir);
    let r = reference();
    // The texts of the logit cases are decoded back from HF's ids; re-encoding must give them again.
    for case in CASES {
        let want = ids(&r, &format!("{case}.input_ids"));
        let text = tok.decode(&want, false).unwrap();
        assert_eq!(encode(&tok, &text), want, "{case}: ids of {text:?}");
    }
    // The converted directory's template (from the GGUF metadata) renders like HF, and the rendered
    // text tokenizes to HF's ids.
    let template = ChatTemplate::from_dir(&dir).unwrap();
    assert_eq!(template.eos_token(), Some("<|im_end|>"));
    let chat: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("chat.json")).unwrap()).unwrap();
    let mut checked = 0;
    for (name, case) in chat["cases"].as_object().unwrap() {
        if case["template"] != "smollm2" {
            continue;
        }
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let text = template.render(&messages, case["add_generation_prompt"].as_bool().unwrap()).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap(), "{name}");
        let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(encode(&tok, &text), want, "{name}: ids");
        checked += 1;
    }
    assert_eq!(checked, 6);
}

#[test]
fn float_logits_and_greedy_match_hf() {
    let dir = model_dir();
    let r = reference();
    let loaded = load_float(&dir, CONTEXT).unwrap();
    assert!(loaded.unused.is_empty(), "unused tensors {:?}", loaded.unused);
    assert_eq!(loaded.config.eos_token_ids, [2], "<|im_end|> ends a turn");
    let vocab = loaded.config.vocab_size;
    let mut generator = Generator::new(loaded.model).unwrap();
    let mut checked = 0;
    for case in CASES {
        let prompt = ids(&r, &format!("{case}.input_ids"));
        let positions: Vec<usize> =
            r.read_i64(&format!("{case}.positions")).unwrap().iter().map(|&p| p as usize).collect();
        let want_logits = r.read_f32(&format!("{case}.logits")).unwrap();
        let greedy = r.read_i64(&format!("{case}.greedy_ids")).map(|v| v.into_iter().map(|x| x as u32).collect());
        let greedy: Vec<u32> = greedy.unwrap_or_default();
        let config = GenerationConfig {
            max_new_tokens: greedy.len(),
            prefill_chunk: 32,
            sampling: Sampling::Greedy,
            // HF generated without stopping at EOS; so does this run.
            eos_ids: vec![],
            collect_prompt_logits: true,
        };
        let out = generator.generate(&prompt, &config).unwrap();
        let logits = out.prompt_logits.unwrap();
        let mut max_diff = 0.0f32;
        for (row, &p) in positions.iter().enumerate() {
            let ours = &logits[p * vocab..(p + 1) * vocab];
            let theirs = &want_logits[row * vocab..(row + 1) * vocab];
            max_diff = ours.iter().zip(theirs).map(|(a, b)| (a - b).abs()).fold(max_diff, |m: f32, d| {
                if m.is_nan() || d.is_nan() {
                    f32::NAN
                } else {
                    m.max(d)
                }
            });
        }
        eprintln!("smollm2 {case}: {} prompt tokens, max |logits - HF| = {max_diff:e}", prompt.len());
        assert!(max_diff <= TOLERANCE, "{case}: max |logits - HF| = {max_diff} > {TOLERANCE}");
        checked += every_position_matches_hf_summary(&r, case, &logits, vocab);
        assert_eq!(out.ids, greedy, "{case}: greedy ids");
    }
    let total: usize = CASES.iter().map(|c| ids(&r, &format!("{c}.input_ids")).len()).sum();
    assert_eq!(checked, total, "every prompt position of every case is compared");
}

/// HF's ids of its `TOP_K` largest logits per row, largest first (`make_smollm2_refs.py`).
const TOP_K: usize = 8;

/// At every prompt position of `case`: our argmax is HF's (or HF's two largest logits are within
/// twice the tolerance of each other and ours is one of HF's top ids), our logsumexp over the
/// vocabulary and our logits at HF's `TOP_K` ids are within [`TOLERANCE`] of HF's. Returns the
/// number of positions compared.
fn every_position_matches_hf_summary(r: &SafetensorsCheckpoint, case: &str, logits: &[f32], vocab: usize) -> usize {
    let n = ids(r, &format!("{case}.input_ids")).len();
    let argmax = ids(r, &format!("{case}.argmax"));
    let lse = r.read_f32(&format!("{case}.logsumexp")).unwrap();
    let top_ids = ids(r, &format!("{case}.topk_ids"));
    let top_logits = r.read_f32(&format!("{case}.topk_logits")).unwrap();
    assert_eq!(logits.len(), n * vocab, "{case}: our prompt logits");
    assert_eq!((argmax.len(), lse.len()), (n, n), "{case}: HF's per-position summary");
    assert_eq!((top_ids.len(), top_logits.len()), (n * TOP_K, n * TOP_K), "{case}: HF's top-{TOP_K}");
    let (mut max_lse, mut max_top, mut ties) = (0.0f64, 0.0f32, 0);
    for (t, (&hf_argmax, &hf_lse)) in argmax.iter().zip(&lse).enumerate() {
        let row = &logits[t * vocab..(t + 1) * vocab];
        let ours = row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best });
        let (hf_ids, hf_logits) = (&top_ids[t * TOP_K..(t + 1) * TOP_K], &top_logits[t * TOP_K..(t + 1) * TOP_K]);
        if ours as u32 != hf_argmax {
            let gap = hf_logits[0] - hf_logits[1];
            assert!(
                gap <= 2.0 * TOLERANCE && hf_ids.contains(&(ours as u32)),
                "{case} position {t}: our argmax {ours}, HF's {hf_argmax} (HF's top-2 gap {gap})"
            );
            ties += 1;
        }
        let max = f64::from(row[ours]);
        let ours_lse = max + row.iter().map(|&v| (f64::from(v) - max).exp()).sum::<f64>().ln();
        let d = (ours_lse - f64::from(hf_lse)).abs();
        assert!(d <= f64::from(TOLERANCE), "{case} position {t}: logsumexp {ours_lse} vs HF's {hf_lse}");
        max_lse = max_lse.max(d);
        for (&id, &want) in hf_ids.iter().zip(hf_logits) {
            let d = (row[id as usize] - want).abs();
            assert!(d <= TOLERANCE, "{case} position {t}: logit of id {id} is {} vs HF's {want}", row[id as usize]);
            max_top = max_top.max(d);
        }
    }
    eprintln!(
        "smollm2 {case}: every position: max |logsumexp - HF| = {max_lse:e}, max |top-{TOP_K} logits - HF| = \
         {max_top:e}, argmax differs at {ties} of {n} (HF's top-2 within tolerance there)"
    );
    n
}

fn generate_args(dir: &Path, extra: &[&str]) -> generate::GenerateArgs {
    use clap::Parser;
    let mut argv = vec!["generate", "--model", dir.to_str().unwrap(), "--context", "256", "--max-new-tokens", "24"];
    argv.extend_from_slice(extra);
    generate::GenerateArgs::try_parse_from(argv).unwrap()
}

fn ids_of(line: &str) -> Vec<u32> {
    line.strip_prefix("ids: ").unwrap().split(',').map(|s| s.parse().unwrap()).collect()
}

/// `generate --chat --prompt`: the model's own template (HF's ids for the prompt), HF's greedy
/// answer, stopped at the model's EOS `<|im_end|>`; streamed text equals the decoded answer.
#[test]
fn generate_chat_is_text_in_text_out() {
    let dir = model_dir();
    let r = reference();
    let want_prompt = ids(&r, "chat.input_ids");
    let greedy = ids(&r, "chat.greedy_ids");
    let eos = greedy.iter().position(|&id| id == 2).expect("HF's answer ends its turn");
    let args = generate_args(&dir, &["--chat", "--prompt", "What is the capital of France?"]);
    let mut streamed = Vec::new();
    let lines = generate::run_generate_io(&args, &mut std::io::empty(), &mut streamed, true).unwrap();
    let got = ids_of(&lines[0]);
    assert_eq!(got[..want_prompt.len()], want_prompt[..], "prompt ids");
    assert_eq!(got[want_prompt.len()..], greedy[..=eos], "answer ids, stopped at <|im_end|>");
    let text = tokenizer(&dir).decode(&greedy[..eos], true).unwrap();
    assert_eq!(String::from_utf8(streamed).unwrap(), format!("{text}\n"));
    assert!(text.contains("Paris"), "{text}");
}

/// Several turns from standard input with a system prompt: each turn's prompt is the whole
/// conversation, so it starts with the previous turn's prompt and answer (ending in `<|im_end|>`).
#[test]
fn generate_chat_keeps_the_conversation() {
    let dir = model_dir();
    let args = generate_args(&dir, &["--chat", "--system", "Answer in one short sentence."]);
    let mut input = std::io::Cursor::new("What is the capital of France?\n\nAnd of Italy?\n");
    let lines = generate::run_generate_io(&args, &mut input, &mut std::io::sink(), false).unwrap();
    assert_eq!(lines.len(), 4, "ids and text per turn: {lines:?}");
    let (first, second) = (ids_of(&lines[0]), ids_of(&lines[2]));
    assert_eq!(first.last(), Some(&2), "the first answer ends at <|im_end|>");
    assert_eq!(second[..first.len()], first[..], "the second prompt continues the first turn");
    let tok = tokenizer(&dir);
    let system = tok.decode(&first[..12], false).unwrap();
    assert!(system.starts_with("<|im_start|>system\nAnswer in one short sentence."), "{system}");
    assert!(lines[3].starts_with("text: ") && lines[3].len() > "text: ".len(), "{lines:?}");
}
