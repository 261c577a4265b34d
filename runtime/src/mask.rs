//! The attention mask of mllm's static NPU graphs (ExecuTorch "SMART_MASK" layout).
//!
//! The mask is `[ar, ctx]`. Columns `[0, ctx-ar)` address the past KV cache (column `c` = position
//! `c`), columns `[ctx-ar, ctx)` the chunk being run (the graph concatenates past ++ present).
//! Row `i` is the chunk's `i`-th token: it sees every stored past position and, causally, chunk
//! tokens `0..=i`. After a chunk is stored in the cache at `[n_past, n_past+n)`, those past columns
//! open in every row ([`AttentionMask::update`]).
//!
//! The stored form is the graph input: u16 with 65535 = attend, 0 = masked. The graph's mask
//! encoding is scale 0.001/65535 and zero point 65535, so attend dequantizes to exactly 0.0 and
//! masked to -0.001; the model computes `where(mask == 0, scores, rowmin(scores) - 20)`, i.e. any
//! nonzero dequantized value means masked.
//!
//! A model with sliding-window layers (Mistral, Phi-3, Gemma 3, Qwen2 with `use_sliding_window`)
//! takes a second plane, `[2, ar, ctx]`: plane 0 is the full causal mask above, plane 1 the same
//! mask restricted to the window, as transformers' `sliding_window_overlay` defines it: the token
//! at position `q` attends position `k` only if `q - k < window`. Full-attention layers read plane
//! 0, sliding layers plane 1 ([`AttentionMask::with_sliding_window`]).

use super::error::RuntimeError;

/// Quantized value meaning "attend".
pub const MASK_ATTEND: u16 = u16::MAX;
/// Quantized value meaning "masked".
pub const MASK_MASKED: u16 = 0;
/// The mask's u16 encoding is part of the graph interface every model file declares.
pub use mllm_dsl::causal_lm::{MASK_SCALE, MASK_ZERO_POINT};

/// Dequantizes one mask value: `(q - zero_point) * scale`.
pub fn dequantize_mask_value(q: u16) -> f32 {
    (i32::from(q) - MASK_ZERO_POINT) as f32 * MASK_SCALE
}

/// Mask `[planes, ar, ctx]` for one chunk graph (one plane, or two with a sliding window).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionMask {
    context_len: usize,
    ar: usize,
    /// The sliding window of plane 1, if any.
    window: Option<usize>,
    /// Position of row 0: chunk row `i` is position `row_base + i`.
    row_base: usize,
    values: Vec<u16>,
}

impl AttentionMask {
    /// A fully masked mask for chunk length 1; call [`init`](Self::init) before use.
    pub fn new(context_len: usize) -> Result<Self, RuntimeError> {
        if context_len < 2 {
            return Err(RuntimeError::InvalidLayout { field: "context_len", value: context_len, expected: ">= 2" });
        }
        Ok(Self { context_len, ar: 1, window: None, row_base: 0, values: vec![MASK_MASKED; context_len] })
    }

    /// A mask with a second plane for sliding-window layers: position `q` attends position `k`
    /// only if `q - k < window` (and the full mask allows it). `None` is [`new`](Self::new).
    pub fn with_sliding_window(context_len: usize, window: Option<usize>) -> Result<Self, RuntimeError> {
        if window == Some(0) {
            return Err(RuntimeError::InvalidLayout { field: "sliding_window", value: 0, expected: ">= 1" });
        }
        let mut mask = Self::new(context_len)?;
        mask.window = window;
        if window.is_some() {
            mask.values.resize(2 * context_len, MASK_MASKED);
        }
        Ok(mask)
    }

    /// Planes: 1, or 2 with a sliding window (the graph input is `[1, planes, ar, ctx]`).
    pub fn planes(&self) -> usize {
        1 + usize::from(self.window.is_some())
    }

    /// The sliding window of plane 1.
    pub fn sliding_window(&self) -> Option<usize> {
        self.window
    }

    /// Rows (chunk length).
    pub fn ar(&self) -> usize {
        self.ar
    }

    /// Columns (context length).
    pub fn context_len(&self) -> usize {
        self.context_len
    }

    /// Past columns, `ctx - ar`; the chunk's columns start here.
    pub fn past_cols(&self) -> usize {
        self.context_len - self.ar
    }

    /// Resizes to `[ar, ctx]` and sets row `i` to attend past columns `[0, n_past)` and chunk
    /// columns `ctx-ar ..= ctx-ar+i` (causal inside the chunk); everything else is masked.
    pub fn init(&mut self, ar: usize, n_past: usize) -> Result<(), RuntimeError> {
        if ar == 0 || ar > self.context_len {
            return Err(RuntimeError::InvalidChunkLen { ar, context_len: self.context_len });
        }
        let ctx = self.context_len;
        let past_cols = ctx - ar;
        if n_past > past_cols {
            return Err(RuntimeError::MaskOutOfRange {
                op: "init",
                start: 0,
                end: n_past,
                ar,
                past_cols,
                context_len: ctx,
            });
        }
        self.ar = ar;
        self.row_base = n_past;
        self.values.clear();
        self.values.resize(self.planes() * ar * ctx, MASK_MASKED);
        for (i, row) in self.values[..ar * ctx].chunks_exact_mut(ctx).enumerate() {
            row[..n_past].fill(MASK_ATTEND);
            row[past_cols..=past_cols + i].fill(MASK_ATTEND);
        }
        self.refresh_window();
        Ok(())
    }

    /// Plane 1 from plane 0: what the full mask allows within the window. Past column `c` holds
    /// position `c`; chunk column `j` position `row_base + j`, as chunk row `j`.
    fn refresh_window(&mut self) {
        let Some(window) = self.window else { return };
        let (ctx, ar, past_cols, base) = (self.context_len, self.ar, self.past_cols(), self.row_base);
        let (full, sliding) = self.values.split_at_mut(ar * ctx);
        for (i, (row, out)) in full.chunks_exact(ctx).zip(sliding.chunks_exact_mut(ctx)).enumerate() {
            let q = base + i;
            for (c, (&v, o)) in row.iter().zip(out.iter_mut()).enumerate() {
                let k = if c < past_cols { c } else { base + c - past_cols };
                *o = if q.saturating_sub(k) < window { v } else { MASK_MASKED };
            }
        }
    }

    /// Opens past columns `[n_past, n_past + n_update)` in every row, after the chunk's first
    /// `n_update` tokens were stored in the cache at `n_past`.
    pub fn update(&mut self, n_past: usize, n_update: usize) -> Result<(), RuntimeError> {
        let ctx = self.context_len;
        let past_cols = self.past_cols();
        let end = n_past + n_update;
        if end > past_cols {
            return Err(RuntimeError::MaskOutOfRange {
                op: "update",
                start: n_past,
                end,
                ar: self.ar,
                past_cols,
                context_len: ctx,
            });
        }
        for row in self.values[..self.ar * ctx].chunks_exact_mut(ctx) {
            row[n_past..end].fill(MASK_ATTEND);
        }
        // The next chunk starts after the stored tokens.
        self.row_base = end;
        self.refresh_window();
        Ok(())
    }

    /// Whether row `row` attends column `col`.
    ///
    /// # Panics
    /// If `row >= ar` or `col >= ctx`.
    pub fn attends(&self, row: usize, col: usize) -> bool {
        self.attends_in(0, row, col)
    }

    /// Whether row `row` attends column `col` in plane `plane` (1: the sliding window's).
    ///
    /// # Panics
    /// If `plane >= planes()`, `row >= ar` or `col >= ctx`.
    pub fn attends_in(&self, plane: usize, row: usize, col: usize) -> bool {
        assert!(col < self.context_len, "mask column {col} >= context {}", self.context_len);
        assert!(row < self.ar && plane < self.planes(), "mask plane {plane} row {row}");
        self.values[(plane * self.ar + row) * self.context_len + col] == MASK_ATTEND
    }

    /// The quantized graph input `[planes, ar, ctx]`, borrowed.
    pub fn as_u16(&self) -> &[u16] {
        &self.values
    }

    /// The quantized graph input `[planes, ar, ctx]`: 65535 = attend, 0 = masked.
    pub fn to_u16(&self) -> Vec<u16> {
        self.values.clone()
    }

    /// The dequantized values of the same encoding: 0.0 = attend, -0.001 = masked.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.values.len()];
        self.write_f32(&mut out);
        out
    }

    /// Writes [`to_f32`](Self::to_f32) into `out` (length `planes * ar * ctx`) without allocating.
    ///
    /// # Panics
    /// If `out` has another length.
    pub fn write_f32(&self, out: &mut [f32]) {
        assert_eq!(out.len(), self.values.len(), "mask f32 buffer length");
        for (o, &q) in out.iter_mut().zip(&self.values) {
            *o = dequantize_mask_value(q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders the mask as rows of '1' (attend) / '0' (masked).
    fn render(mask: &AttentionMask) -> Vec<String> {
        mask.as_u16()
            .chunks(mask.context_len())
            .map(|row| {
                row.iter()
                    .map(|&v| match v {
                        MASK_ATTEND => '1',
                        MASK_MASKED => '0',
                        _ => '?',
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn init_and_update_chunk_of_three_in_context_eight() {
        // Past columns 0..5, chunk columns 5..8.
        let mut mask = AttentionMask::new(8).unwrap();
        mask.init(3, 0).unwrap();
        assert_eq!(render(&mask), ["00000100", "00000110", "00000111"]);
        mask.update(0, 3).unwrap();
        assert_eq!(render(&mask), ["11100100", "11100110", "11100111"]);
        // A shorter last chunk (2 valid tokens) opens only those two columns.
        mask.update(3, 2).unwrap();
        assert_eq!(render(&mask), ["11111100", "11111110", "11111111"]);
        assert!(mask.update(3, 3).is_err());
    }

    #[test]
    fn init_with_past_and_decode_layout() {
        let mut mask = AttentionMask::new(6).unwrap();
        mask.init(2, 3).unwrap();
        assert_eq!(render(&mask), ["111010", "111011"]);
        mask.init(1, 3).unwrap();
        assert_eq!(render(&mask), ["111001"]);
        mask.update(3, 1).unwrap();
        assert_eq!(render(&mask), ["111101"]);
        mask.update(4, 1).unwrap();
        assert_eq!(render(&mask), ["111111"]);
        // Position 5 cannot be stored: the decode graph has only 5 past columns.
        let err = mask.update(5, 1).unwrap_err();
        assert!(matches!(err, RuntimeError::MaskOutOfRange { op: "update", past_cols: 5, .. }), "{err}");
        assert!(mask.init(2, 5).is_err());
        assert!(mask.init(0, 0).is_err());
        assert!(mask.init(7, 0).is_err());
    }

    /// Renders plane 1 (the sliding window's).
    fn render_window(mask: &AttentionMask) -> Vec<String> {
        let ctx = mask.context_len();
        (0..mask.ar()).map(|r| (0..ctx).map(|c| if mask.attends_in(1, r, c) { '1' } else { '0' }).collect()).collect()
    }

    #[test]
    fn sliding_window_plane_follows_the_positions() {
        // Window 3, context 8, chunks of 3: past columns 0..5, chunk columns 5..8.
        let mut mask = AttentionMask::with_sliding_window(8, Some(3)).unwrap();
        assert_eq!(mask.planes(), 2);
        mask.init(3, 0).unwrap();
        assert_eq!(render(&mask)[..3], ["00000100", "00000110", "00000111"]);
        assert_eq!(render_window(&mask), ["00000100", "00000110", "00000111"]);
        // Positions 0..3 stored; rows are positions 3, 4, 5: position q sees q-2..=q.
        mask.update(0, 3).unwrap();
        assert_eq!(render_window(&mask), ["01100100", "00100110", "00000111"]);
        // Decode at position 5 after 5 stored positions: sees 3, 4 (past) and itself.
        mask.init(1, 5).unwrap();
        let full: Vec<bool> = (0..8).map(|c| mask.attends(0, c)).collect();
        assert_eq!(full, [true, true, true, true, true, false, false, true]);
        assert_eq!(render_window(&mask), ["00011001"]);
        assert_eq!(mask.as_u16().len(), 2 * 8);
        assert!(AttentionMask::with_sliding_window(8, Some(0)).is_err());
        assert_eq!(AttentionMask::with_sliding_window(8, None).unwrap().planes(), 1);
    }

    #[test]
    fn encodings() {
        let mut mask = AttentionMask::new(4).unwrap();
        mask.init(2, 1).unwrap();
        assert_eq!(mask.to_u16(), [65535, 0, 65535, 0, 65535, 0, 65535, 65535]);
        let f = mask.to_f32();
        for (q, v) in mask.to_u16().into_iter().zip(f) {
            if q == MASK_ATTEND {
                assert_eq!(v, 0.0);
            } else {
                assert!((v + 0.001).abs() < 1e-9, "masked dequantizes to {v}");
            }
        }
        assert!(mask.attends(1, 3));
        assert!(!mask.attends(0, 3));
    }
}
