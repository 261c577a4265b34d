//! Expansion of `#[module]` on structs and impl blocks.

use crate::ctxt::Ctxt;
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{parse_quote, Fields, ImplItem, Item, ItemImpl, ItemStruct, LitStr, Path, ReturnType, Type};

/// Field types that are configuration, never modules.
const CONFIG_TYPES: &[&str] = &[
    "usize",
    "isize",
    "u8",
    "u16",
    "u32",
    "u64",
    "i8",
    "i16",
    "i32",
    "i64",
    "f32",
    "f64",
    "bool",
    "String",
    "char",
    "DType",
    "PhantomData",
];

pub fn module(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    let krate = parse_top_attr(attr, &mut cx);
    let item: Item = match syn::parse2(item) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    let out = match item {
        Item::Struct(s) => expand_struct(s, &krate, &mut cx),
        Item::Impl(i) => expand_impl(i, &krate, &mut cx),
        other => {
            cx.error_spanned_by(&other, "#[module] applies to a struct with named fields or to its impl block");
            quote!(#other)
        }
    };
    match cx.check() {
        Ok(()) => out,
        // Keep the item so that later errors (uses of the struct) do not pile up.
        Err(errs) => quote!(#errs #out),
    }
}

/// `#[module]` or `#[module(crate = path)]` on the item itself.
fn parse_top_attr(attr: TokenStream, cx: &mut Ctxt) -> Path {
    let mut krate: Path = parse_quote!(::mllm_dsl);
    if attr.is_empty() {
        return krate;
    }
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("crate") {
            krate = meta.value()?.parse()?;
            Ok(())
        } else {
            Err(meta.error("unknown #[module] option; expected `crate = path`"))
        }
    });
    if let Err(e) = syn::parse::Parser::parse2(parser, attr) {
        cx.syn_error(e);
    }
    krate
}

struct Child {
    ident: syn::Ident,
    name: String,
    span: Span,
}

fn expand_struct(mut s: ItemStruct, krate: &Path, cx: &mut Ctxt) -> TokenStream {
    let fields = match &mut s.fields {
        Fields::Named(f) => &mut f.named,
        _ => {
            cx.error_spanned_by(
                &s.ident,
                "#[module] needs a struct with named fields: field names become module names",
            );
            return quote!(#s);
        }
    };
    let mut children: Vec<Child> = Vec::new();
    for field in fields.iter_mut() {
        let ident = field.ident.clone().expect("named field");
        let mut rename: Option<LitStr> = None;
        let mut skip = false;
        let mut keep = Vec::new();
        for attr in field.attrs.drain(..) {
            if !attr.path().is_ident("module") {
                keep.push(attr);
                continue;
            }
            let res = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("rename") {
                    let lit: LitStr = meta.value()?.parse()?;
                    if rename.is_some() {
                        cx.error_spanned_by(&lit, "duplicate `rename`");
                    }
                    rename = Some(lit);
                    Ok(())
                } else if meta.path.is_ident("skip") {
                    skip = true;
                    Ok(())
                } else {
                    Err(meta.error("unknown field option; expected `rename = \"name\"` or `skip`"))
                }
            });
            if let Err(e) = res {
                cx.syn_error(e);
            }
        }
        field.attrs = keep;
        if skip {
            if let Some(r) = &rename {
                cx.error_spanned_by(r, "a skipped field has no module name to rename");
            }
            continue;
        }
        if rename.is_none() && is_config_type(&field.ty) {
            continue;
        }
        let name = match &rename {
            Some(lit) => {
                let v = lit.value();
                if v.is_empty() || v.contains('.') || v.chars().any(char::is_whitespace) {
                    cx.error_spanned_by(
                        lit,
                        "a module name must be one path segment: non-empty, without '.' or spaces",
                    );
                }
                v
            }
            None => ident.to_string().trim_start_matches("r#").to_string(),
        };
        if let Some(prev) = children.iter().find(|c| c.name == name) {
            cx.error_spanned_by(
                rename.as_ref().map(|r| quote!(#r)).unwrap_or_else(|| quote!(#ident)),
                format!("module name `{name}` is already used by field `{}`", prev.ident),
            );
        }
        children.push(Child { ident, name, span: field.ty.span() });
    }
    if children.is_empty() {
        cx.error_spanned_by(
            &s.ident,
            "a #[module] struct needs at least one module or layer field (config fields of plain types are skipped)",
        );
    }
    let binds = children.iter().map(|c| {
        let (ident, name) = (&c.ident, &c.name);
        quote_spanned! {c.span=>
            #krate::__private::Module::bind(&mut self.#ident, &#krate::__private::join_path(path, #name), src)?;
        }
    });
    let paths = children.iter().map(|c| {
        let ident = &c.ident;
        quote! {
            if let ::core::option::Option::Some(p) = #krate::__private::Module::module_path(&self.#ident) {
                return ::core::option::Option::Some(#krate::__private::parent_path(&p));
            }
        }
    });
    let name = &s.ident;
    let (impl_g, ty_g, where_g) = s.generics.split_for_impl();
    quote! {
        #s

        impl #impl_g #krate::__private::Module for #name #ty_g #where_g {
            fn bind(&mut self, path: &str, src: &#krate::__private::ParamSource<'_>) -> #krate::Result<()> {
                #(#binds)*
                ::core::result::Result::Ok(())
            }

            /// The path of the first bound child without its last segment.
            fn module_path(&self) -> ::core::option::Option<::std::string::String> {
                #(#paths)*
                ::core::option::Option::None
            }
        }
    }
}

fn is_config_type(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => {
            let Some(last) = p.path.segments.last() else {
                return false;
            };
            let ident = last.ident.to_string();
            if CONFIG_TYPES.contains(&ident.as_str()) {
                return true;
            }
            // Vec<f32>, Option<usize>, ...: config when the element type is.
            if matches!(ident.as_str(), "Vec" | "Option" | "Box") {
                if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
                    return args.args.iter().all(|a| matches!(a, syn::GenericArgument::Type(t) if is_config_type(t)));
                }
            }
            false
        }
        Type::Reference(_) | Type::Array(_) | Type::Tuple(_) => true,
        _ => false,
    }
}

/// Wraps `forward` and `forward_*` methods (of an inherent impl or of a trait impl such as a
/// model file's `impl DecoderAttention for ...`) so that each call enters the module's scope.
fn expand_impl(mut imp: ItemImpl, krate: &Path, cx: &mut Ctxt) -> TokenStream {
    let mut found = false;
    for item in imp.items.iter_mut() {
        let ImplItem::Fn(f) = item else { continue };
        if !is_forward(&f.sig.ident) {
            continue;
        }
        found = true;
        if f.sig.receiver().is_none() {
            cx.error_spanned_by(
                &f.sig,
                format!("`{}` must take `&self` (the module's path comes from self)", f.sig.ident),
            );
            continue;
        }
        if f.sig.asyncness.is_some() {
            cx.error_spanned_by(f.sig.asyncness, format!("`{}` cannot be async", f.sig.ident));
            continue;
        }
        let ret = match &f.sig.output {
            ReturnType::Type(_, ty) => ty.clone(),
            ReturnType::Default => {
                cx.error_spanned_by(
                    &f.sig,
                    format!("`{}` must return mllm_dsl::Result<...> (tensors, tuples or vectors of them)", f.sig.ident),
                );
                continue;
            }
        };
        let body = &f.block;
        let new_body: syn::Block = parse_quote!({
            let __mllm_path = #krate::__private::Module::module_path(self);
            #krate::__private::scoped(__mllm_path, move || -> #ret #body)
        });
        f.block = new_body;
    }
    if !found {
        cx.error_spanned_by(
            &imp.self_ty,
            "#[module] on an impl block wraps its `forward` (or `forward_*`) methods, but there is none",
        );
    }
    quote!(#imp)
}

/// `forward`, or a variant such as `CausalLm::forward_rows`.
fn is_forward(ident: &syn::Ident) -> bool {
    let name = ident.to_string();
    name == "forward" || name.starts_with("forward_")
}
