use super::*;

/// The references of `src` as `scope:path@line` strings.
fn refs(src: &str) -> Vec<String> {
    scan(src)
        .refs
        .iter()
        .map(|r| {
            format!(
                "{}:{}@{}",
                r.scope.join("::"),
                r.segments.join("::"),
                r.line
            )
        })
        .collect()
}

#[test]
fn use_groups_expand_to_one_path_per_leaf() {
    let src = "use crate::{a::b, c};\n\
               use super::{x::{self, Y as Z}, w::*};\n\
               pub(crate) use self::inner::Thing;\n";
    assert_eq!(
        refs(src),
        [
            ":crate::a::b@1",
            ":crate::c@1",
            ":super::x@2",
            ":super::x::Y@2",
            ":super::w@2",
            ":self::inner::Thing@3"
        ]
    );
}

#[test]
fn a_multi_line_group_gives_each_leaf_its_own_line() {
    let src = "use crate::{\n    rules::validate::resolve,\n    algo::Limit,\n};\n";
    assert_eq!(
        refs(src),
        [
            ":crate::rules::validate::resolve@2",
            ":crate::algo::Limit@3"
        ]
    );
}

#[test]
fn paths_in_function_bodies_and_types_are_found() {
    let src = "fn f(x: crate::a::X) -> super::b::Y {\n\
               \x20   let v = crate::c::d::make::<u8>(1);\n\
               \x20   if self::e::ok() { super::super::g::h() } else { todo!() }\n\
               }\n";
    assert_eq!(
        refs(src),
        [
            ":crate::a::X@1",
            ":super::b::Y@1",
            ":crate::c::d::make@2",
            ":self::e::ok@3",
            ":super::super::g::h@3"
        ]
    );
}

#[test]
fn comments_strings_visibility_and_macro_paths_are_not_references() {
    let src = r####"
// use crate::in_a_comment;
/* use crate::in_a_block /* nested */ crate::still_comment */
/// Doc: [`crate::doc::Link`]
const S: &str = "crate::in_a_string";
const R: &str = r#"super::in_a_raw "string""#;
const C: char = '"';
pub(in crate::vis) fn f<'a>(x: &'a str) -> &'a str { x }
macro_rules! m { () => { $crate::from_a_macro() }; }
pub(crate) struct T;
fn g(&self) { self.x; }
"####;
    assert_eq!(refs(src), Vec::<String>::new());
}

#[test]
fn test_code_is_left_out() {
    let src = "use crate::kept;\n\
               #[cfg(test)]\nuse crate::only_tests;\n\
               #[cfg(test)]\nmod tests { use crate::x; fn long() {} }\n\
               #[cfg(all(test, feature = \"f\"))]\nmod more;\n\
               #[test]\nfn t() { crate::y::z(); }\n\
               fn f() { crate::after::tests(); }\n";
    let s = scan(src);
    assert_eq!(refs(src), [":crate::kept@1", ":crate::after::tests@10"]);
    assert!(s.mods.is_empty(), "{:?}", s.mods);
    assert_eq!(s.fns.iter().map(|f| &f.name[..]).collect::<Vec<_>>(), ["f"]);
}

#[test]
fn mod_declarations_inline_and_external_with_their_scope() {
    let src = "pub mod a;\n\
               #[path = \"other.rs\"]\nmod b;\n\
               mod c {\n    mod d;\n    fn f() { crate::a::g(); }\n}\n\
               mod e;\n";
    let s = scan(src);
    let m: Vec<String> = s
        .mods
        .iter()
        .map(|m| {
            format!(
                "{}/{} {} {:?}@{}",
                m.scope.join("::"),
                m.name,
                m.inline,
                m.path_attr,
                m.line
            )
        })
        .collect();
    assert_eq!(
        m,
        [
            "/a false None@1",
            "/b false Some(\"other.rs\")@3",
            "/c true None@4",
            "c/d false None@5",
            "/e false None@8"
        ]
    );
    assert_eq!(refs(src), ["c:crate::a::g@6"]);
}

#[test]
fn function_spans_count_their_lines_nested_ones_apart() {
    let src = "fn outer(a: [u8; 2]) -> u8 {\n\
               \x20   fn inner() {\n\
               \x20   }\n\
               \x20   let c = |x: u8| { x };\n\
               \x20   c(a[0])\n\
               }\n\
               trait T { fn decl(&self); fn with_body(&self) where Self: Sized { } }\n";
    let s = scan(src);
    let spans: Vec<(String, u32)> = s.fns.iter().map(|f| (f.name.clone(), f.lines())).collect();
    assert_eq!(
        spans,
        [
            ("inner".to_string(), 2),
            ("outer".to_string(), 6),
            ("with_body".to_string(), 1)
        ]
    );
}

#[test]
fn lifetimes_and_char_literals_do_not_swallow_code() {
    let src = "fn f<'a>(x: &'a u8) -> char { let _ = '\\''; let _ = 'é'; crate::z::w(); 'x' }\n\
               fn g() { crate::after::it(); }\n";
    assert_eq!(refs(src), [":crate::z::w@1", ":crate::after::it@2"]);
    assert_eq!(scan(src).fns.len(), 2);
}
