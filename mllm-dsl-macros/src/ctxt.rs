//! Error collection (after serde's `Ctxt`): every problem is recorded with its span and all are
//! reported at once, so a user fixes them in one build.

use proc_macro2::TokenStream;
use quote::ToTokens;
use std::fmt::Display;

#[derive(Default)]
pub struct Ctxt {
    errors: Vec<syn::Error>,
}

impl Ctxt {
    pub fn error_spanned_by<T: ToTokens, M: Display>(&mut self, tokens: T, message: M) {
        self.errors.push(syn::Error::new_spanned(tokens.into_token_stream(), message));
    }

    pub fn syn_error(&mut self, err: syn::Error) {
        self.errors.push(err);
    }

    /// `Ok` when nothing was recorded; otherwise all errors combined.
    pub fn check(self) -> Result<(), TokenStream> {
        let mut iter = self.errors.into_iter();
        match iter.next() {
            None => Ok(()),
            Some(mut first) => {
                for e in iter {
                    first.combine(e);
                }
                Err(first.to_compile_error())
            }
        }
    }
}
