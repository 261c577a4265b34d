//! Graph selection: a model holding a family of graphs (chunk sizes x context lengths, each with
//! its modelled cost per call) runs every step on the graph that minimises the modelled cost of
//! the work left.
//!
//! - **Prompt.** [`GraphMenu::plan_prompt`] finds, by dynamic programming over the prompt's
//!   positions, the sequence of calls of least total cost: a 100-token prompt is one call of a
//!   128-token graph rather than four of a 32-token one when the model says so. Each call obeys the
//!   placement rule of [`Sequence`] (a chunk-`ar` graph at context `ctx` stores its result only
//!   while `n_past + n <= ctx - ar`).
//! - **Context.** A sequence starts on the smallest context length. It moves to a larger one only
//!   when it must: during the prompt when the prompt does not fit the current context (the plan
//!   then chooses where the move is cheapest), during decoding when the next token's K/V cannot be
//!   stored. A move re-strides the K/V cache into the larger rows ([`Sequence::move_to_context`]);
//!   nothing is recomputed.
//! - Every call and move is recorded ([`Step`]) so a command can print the choices.
//!
//! Which graph runs does not change the tokens on a backend whose result for a row depends only on
//! the positions it attends to; the tests and `generate --select` compare with the fixed pair.

use std::ops::ControlFlow;

use super::error::RuntimeError;
use super::model::ChunkModel;
use super::sampler::Sampler;
use super::sequence::Sequence;

/// One graph of a family and its modelled cost per call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraphChoice {
    pub chunk: usize,
    pub context_len: usize,
    /// Modelled seconds per call.
    pub cost_s: f64,
}

/// The graphs a generation may choose from.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphMenu {
    choices: Vec<GraphChoice>,
    /// Context lengths, ascending.
    contexts: Vec<usize>,
}

/// One step of a generation that selects its graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `n_tokens` tokens at position `at` run as one call of the chunk-`chunk` graph of context
    /// `context_len`; `prompt` tells prompt calls from decode calls.
    Call { chunk: usize, context_len: usize, at: usize, n_tokens: usize, prompt: bool },
    /// The sequence moved from context `from` to `to` with `at` positions stored.
    Move { from: usize, to: usize, at: usize },
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Step::Call { chunk, context_len, at, n_tokens, prompt } => write!(
                f,
                "{} positions {at}..{}: chunk {chunk} at context {context_len}",
                if prompt { "prompt" } else { "decode" },
                at + n_tokens
            ),
            Step::Move { from, to, at } => write!(f, "move: context {from} -> {to} with {at} positions stored"),
        }
    }
}

/// One planned call: the graph and how many of its rows hold tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedCall {
    pub chunk: usize,
    pub context_len: usize,
    pub n_tokens: usize,
}

/// Whether `n` tokens at position `at` can run as one chunk-`ar` call at context `ctx` and leave
/// a sequence that can continue (`store`) or, with `store` false, end exactly at the context.
fn placeable(ctx: usize, ar: usize, at: usize, n: usize, may_end_unstored: bool) -> bool {
    if ar == 0 || ar >= ctx || n == 0 || n > ar {
        return false;
    }
    let (end, past) = (at + n, ctx - ar);
    end <= past || (may_end_unstored && end == ctx && at <= past)
}

impl GraphMenu {
    /// Every graph the model holds with its cost; each context length needs a decode graph
    /// (chunk 1), and costs must be finite and positive.
    pub fn new(mut choices: Vec<GraphChoice>) -> Result<GraphMenu, RuntimeError> {
        let bad = |detail: String| RuntimeError::GraphMenu { detail };
        if choices.is_empty() {
            return Err(bad("no graphs".into()));
        }
        choices.sort_by_key(|c| (c.context_len, std::cmp::Reverse(c.chunk)));
        for (i, c) in choices.iter().enumerate() {
            if !(c.cost_s.is_finite() && c.cost_s > 0.0) {
                return Err(bad(format!(
                    "chunk {} at context {} has cost {} s; expected a finite positive time",
                    c.chunk, c.context_len, c.cost_s
                )));
            }
            if c.chunk == 0 || c.chunk >= c.context_len {
                return Err(bad(format!("chunk {} does not fit context {}", c.chunk, c.context_len)));
            }
            if choices[..i].iter().any(|o| o.chunk == c.chunk && o.context_len == c.context_len) {
                return Err(bad(format!("chunk {} at context {} is listed twice", c.chunk, c.context_len)));
            }
        }
        let mut contexts: Vec<usize> = choices.iter().map(|c| c.context_len).collect();
        contexts.dedup();
        for &ctx in &contexts {
            if !choices.iter().any(|c| c.context_len == ctx && c.chunk == 1) {
                return Err(bad(format!("context {ctx} has no decode graph (chunk 1)")));
            }
        }
        Ok(GraphMenu { choices, contexts })
    }

    /// Context lengths, ascending.
    pub fn contexts(&self) -> &[usize] {
        &self.contexts
    }

    /// The largest context length.
    pub fn largest_context(&self) -> usize {
        *self.contexts.last().expect("a menu has at least one graph")
    }

    /// Every graph, by context length then chunk (largest first).
    pub fn choices(&self) -> &[GraphChoice] {
        &self.choices
    }

    /// Modelled seconds of one decode call at `context_len`.
    fn decode_cost(&self, context_len: usize) -> Option<f64> {
        self.choices.iter().find(|c| c.context_len == context_len && c.chunk == 1).map(|c| c.cost_s)
    }

    /// The calls of least modelled cost that run `n_tokens` prompt tokens from position `n_past`,
    /// starting at context `context_len`. The sequence stays at `context_len` when the prompt fits
    /// it (its rows hold `context_len - 1` positions); otherwise the plan moves up at the point
    /// where that costs least. Only in the largest context may the prompt end exactly at the
    /// context length without storing its last K/V (nothing can follow it).
    pub fn plan_prompt(
        &self,
        n_past: usize,
        n_tokens: usize,
        context_len: usize,
    ) -> Result<Vec<PlannedCall>, RuntimeError> {
        let start = self.contexts.iter().position(|&c| c == context_len).ok_or_else(|| RuntimeError::GraphMenu {
            detail: format!("the sequence is at context {context_len}, which no graph has"),
        })?;
        let largest = self.largest_context();
        if n_tokens == 0 {
            return Err(RuntimeError::EmptyPrompt);
        }
        if n_past + n_tokens > largest {
            return Err(RuntimeError::PromptTooLong { prompt_len: n_past + n_tokens, context_len: largest });
        }
        let contexts = &self.contexts[start..];
        let k_n = contexts.len();
        // best[k][i]: least cost to run tokens i.. at contexts[k]; choice[k][i]: the call, or a move.
        #[derive(Clone, Copy)]
        enum Choice {
            Call(usize),
            Move,
        }
        let mut best = vec![vec![f64::INFINITY; n_tokens + 1]; k_n];
        let mut choice = vec![vec![None::<Choice>; n_tokens + 1]; k_n];
        for k in (0..k_n).rev() {
            let ctx = contexts[k];
            // Moving up is allowed only when the prompt cannot finish at this context.
            let must_move = n_past + n_tokens > ctx - 1 && k + 1 < k_n;
            best[k][n_tokens] = 0.0;
            for i in (0..n_tokens).rev() {
                let at = n_past + i;
                let (mut cost, mut pick) = (f64::INFINITY, None);
                for (j, c) in self.choices.iter().enumerate().filter(|(_, c)| c.context_len == ctx) {
                    let n = c.chunk.min(n_tokens - i);
                    let may_end = ctx == largest && i + n == n_tokens;
                    if !placeable(ctx, c.chunk, at, n, may_end) {
                        continue;
                    }
                    let total = c.cost_s + best[k][i + n];
                    if total < cost {
                        (cost, pick) = (total, Some(Choice::Call(j)));
                    }
                }
                if must_move && best[k + 1][i] < cost {
                    (cost, pick) = (best[k + 1][i], Some(Choice::Move));
                }
                (best[k][i], choice[k][i]) = (cost, pick);
            }
        }
        let (mut plan, mut k, mut i) = (Vec::new(), 0, 0);
        while i < n_tokens {
            match choice[k][i] {
                Some(Choice::Call(j)) => {
                    let c = self.choices[j];
                    let n = c.chunk.min(n_tokens - i);
                    plan.push(PlannedCall { chunk: c.chunk, context_len: c.context_len, n_tokens: n });
                    i += n;
                }
                Some(Choice::Move) => k += 1,
                None => {
                    return Err(RuntimeError::PromptTooLong { prompt_len: n_past + n_tokens, context_len: largest })
                }
            }
        }
        Ok(plan)
    }

    /// Modelled seconds of `plan`.
    pub fn plan_cost(&self, plan: &[PlannedCall]) -> f64 {
        plan.iter()
            .filter_map(|p| self.choices.iter().find(|c| c.chunk == p.chunk && c.context_len == p.context_len))
            .map(|c| c.cost_s)
            .sum()
    }

    /// Modelled seconds of generating `new_tokens` after a prompt of `prompt_len` tokens from the
    /// start: the prompt's plan, then one decode call per generated token but the last, at the
    /// smallest context holding it. `None` when it does not fit the largest context.
    pub fn modelled_seconds(&self, prompt_len: usize, new_tokens: usize) -> Option<(f64, f64)> {
        let plan = self.plan_prompt(0, prompt_len, self.contexts[0]).ok()?;
        let prefill = self.plan_cost(&plan);
        let mut ctx = plan.last().map_or(self.contexts[0], |p| p.context_len);
        let mut decode = 0.0;
        // Decode call t runs the token at position prompt_len + t and must store it.
        for at in prompt_len..(prompt_len + new_tokens).saturating_sub(1) {
            while at + 1 > ctx - 1 {
                ctx = *self.contexts.iter().find(|&&c| c > ctx)?;
            }
            decode += self.decode_cost(ctx)?;
        }
        Some((prefill, decode))
    }
}

/// What [`prefill`] returns.
pub(super) struct Prefilled {
    /// The logits of the prompt's last token.
    pub last: Vec<f32>,
    /// With `collect`, the logits of all its tokens.
    pub all: Option<Vec<f32>>,
    /// Graph calls made.
    pub calls: usize,
}

/// Runs `prompt` on `seq` (at its current position and context) with the calls of
/// [`GraphMenu::plan_prompt`], moving the sequence where the plan does.
pub(super) fn prefill<M: ChunkModel + ?Sized>(
    menu: &GraphMenu,
    model: &mut M,
    seq: &mut Sequence<M::Kv>,
    prompt: &[u32],
    collect: bool,
    steps: &mut Vec<Step>,
) -> Result<Prefilled, RuntimeError> {
    let plan = menu.plan_prompt(seq.n_past(), prompt.len(), seq.layout().context_len)?;
    let vocab = seq.layout().vocab_size;
    let mut all = collect.then(|| Vec::with_capacity(prompt.len() * vocab));
    let (mut done, mut last) = (0, Vec::new());
    for call in &plan {
        move_to(seq, call.context_len, steps)?;
        let n = call.n_tokens;
        let rows = if collect {
            0..n
        } else if done + n == prompt.len() {
            n - 1..n
        } else {
            n..n
        };
        let at = seq.n_past();
        let out = seq.run_chunk(model, &prompt[done..done + n], call.chunk, rows)?;
        steps.push(Step::Call { chunk: call.chunk, context_len: call.context_len, at, n_tokens: n, prompt: true });
        if let Some(all) = all.as_mut() {
            all.extend_from_slice(&out.logits()[..n * vocab]);
        }
        done += n;
        if done == prompt.len() {
            last = out.logits_row(n - 1).to_vec();
        }
    }
    Ok(Prefilled { last, all, calls: plan.len() })
}

/// Moves `seq` to `context_len` when it is elsewhere, recording the move.
fn move_to<T: Copy + Default>(
    seq: &mut Sequence<T>,
    context_len: usize,
    steps: &mut Vec<Step>,
) -> Result<(), RuntimeError> {
    let from = seq.layout().context_len;
    if from != context_len {
        seq.move_to_context(context_len)?;
        steps.push(Step::Move { from, to: context_len, at: seq.n_past() });
    }
    Ok(())
}

/// What [`decode`] did.
pub(super) struct Decoded {
    pub ids: Vec<u32>,
    pub stop_reason: super::generate::StopReason,
    pub steps: usize,
}

/// Samples from `first_logits`, then feeds each new id back through the decode graph of the
/// sequence's context, moving to the next larger context of `menu` when the next token's K/V
/// cannot be stored in the current one. Stops as [`super::TokenGenerator`] does, the context
/// being the largest of the menu.
#[allow(clippy::too_many_arguments)]
pub(super) fn decode<M: ChunkModel + ?Sized>(
    menu: &GraphMenu,
    model: &mut M,
    seq: &mut Sequence<M::Kv>,
    first_logits: &[f32],
    sampler: &mut Sampler,
    eos_ids: &[u32],
    max_new_tokens: usize,
    on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    steps: &mut Vec<Step>,
) -> Result<Decoded, RuntimeError> {
    use super::generate::StopReason;
    let largest = menu.largest_context();
    let done = |ids, stop_reason, steps| Decoded { ids, stop_reason, steps };
    if max_new_tokens == 0 {
        return Ok(done(Vec::new(), StopReason::MaxNewTokens, 0));
    }
    if seq.n_past() >= largest {
        return Ok(done(Vec::new(), StopReason::ContextFull, 0));
    }
    let mut ids = Vec::new();
    let mut runs = 0;
    let mut token = sampler.sample(first_logits)?;
    loop {
        ids.push(token);
        let stop = if on_token(token).is_break() {
            Some(StopReason::Cancelled)
        } else if eos_ids.contains(&token) {
            Some(StopReason::Eos(token))
        } else if ids.len() >= max_new_tokens {
            Some(StopReason::MaxNewTokens)
        } else if seq.n_past() + 1 >= largest {
            Some(StopReason::ContextFull)
        } else {
            None
        };
        if let Some(reason) = stop {
            return Ok(done(ids, reason, runs));
        }
        // The token's K/V must be stored (another token follows): move up when this context's
        // decode rows are full.
        let ctx = seq.layout().context_len;
        if seq.n_past() + 1 > ctx - 1 {
            let next = menu.contexts().iter().copied().find(|&c| c > ctx).unwrap_or(largest);
            move_to(seq, next, steps)?;
        }
        let (at, ctx) = (seq.n_past(), seq.layout().context_len);
        let out = seq.run_chunk(model, &[token], 1, 0..1)?;
        steps.push(Step::Call { chunk: 1, context_len: ctx, at, n_tokens: 1, prompt: false });
        runs += 1;
        token = sampler.sample(out.logits_row(0))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Costs shaped like a memory-bound phone: a call costs its weights (1.0) plus a little per
    /// row and per context column.
    fn menu(chunks: &[usize], contexts: &[usize]) -> GraphMenu {
        let choices = contexts
            .iter()
            .flat_map(|&ctx| {
                chunks.iter().map(move |&chunk| GraphChoice {
                    chunk,
                    context_len: ctx,
                    cost_s: 1.0 + 0.01 * chunk as f64 + 1e-4 * ctx as f64,
                })
            })
            .collect();
        GraphMenu::new(choices).unwrap()
    }

    #[test]
    fn a_100_token_prompt_is_one_128_call() {
        let m = menu(&[128, 32, 1], &[1024]);
        let plan = m.plan_prompt(0, 100, 1024).unwrap();
        assert_eq!(plan, [PlannedCall { chunk: 128, context_len: 1024, n_tokens: 100 }]);
        // Four tokens: the 32-token graph is cheaper than the 128 one and than four decode calls.
        assert_eq!(m.plan_prompt(0, 4, 1024).unwrap(), [PlannedCall { chunk: 32, context_len: 1024, n_tokens: 4 }]);
    }

    #[test]
    fn the_plan_respects_the_placement_rule_near_the_end_of_the_context() {
        let m = menu(&[32, 1], &[64]);
        // 40 tokens from 0: 32 fit (end 32 <= 64 - 32), then 8 more: a chunk-32 call at 32 ends at
        // 40 > 32 past columns, so the tail runs in the decode graph.
        let plan = m.plan_prompt(0, 40, 64).unwrap();
        let chunks: Vec<usize> = plan.iter().map(|p| p.chunk).collect();
        assert_eq!(chunks, [32, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert!(matches!(
            m.plan_prompt(0, 65, 64),
            Err(RuntimeError::PromptTooLong { prompt_len: 65, context_len: 64 })
        ));
        // The largest context may be filled exactly by the prompt.
        assert_eq!(m.plan_prompt(0, 64, 64).unwrap().iter().map(|p| p.n_tokens).sum::<usize>(), 64);
    }

    #[test]
    fn a_prompt_moves_to_the_larger_context_only_when_it_must() {
        let m = menu(&[32, 1], &[64, 256]);
        assert!(m.plan_prompt(0, 50, 64).unwrap().iter().all(|p| p.context_len == 64));
        let plan = m.plan_prompt(0, 100, 64).unwrap();
        assert!(plan.iter().any(|p| p.context_len == 256), "{plan:?}");
        // Once moved it never goes back down.
        let first_big = plan.iter().position(|p| p.context_len == 256).unwrap();
        assert!(plan[first_big..].iter().all(|p| p.context_len == 256));
        assert_eq!(plan.iter().map(|p| p.n_tokens).sum::<usize>(), 100);
    }

    #[test]
    fn bad_menus_are_refused() {
        let no_decode = vec![GraphChoice { chunk: 32, context_len: 64, cost_s: 1.0 }];
        assert!(matches!(GraphMenu::new(no_decode), Err(RuntimeError::GraphMenu { .. })));
        let nan = vec![GraphChoice { chunk: 1, context_len: 64, cost_s: f64::NAN }];
        assert!(GraphMenu::new(nan).unwrap_err().to_string().contains("NaN"));
        assert!(GraphMenu::new(Vec::new()).is_err());
    }
}
