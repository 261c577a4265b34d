//! "Did you mean" suggestions for a tensor key that is not in the checkpoint.

/// Suggestions returned at most.
const MAX_SUGGESTIONS: usize = 3;

/// Up to 3 of `candidates` closest to `key` by Levenshtein distance, nearest first (ties by name).
/// Candidates further than half the key's length (at least 3 edits) are not suggested: past that
/// point they share too little with the key to help.
pub(crate) fn near_matches<'a>(key: &str, candidates: impl Iterator<Item = &'a str>) -> Vec<String> {
    let limit = (key.chars().count() / 2).max(3);
    let mut scored: Vec<(usize, &str)> =
        candidates.map(|c| (strsim::levenshtein(key, c), c)).filter(|&(d, _)| d <= limit).collect();
    scored.sort_unstable();
    scored.into_iter().take(MAX_SUGGESTIONS).map(|(_, c)| c.to_string()).collect()
}
