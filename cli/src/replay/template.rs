//! Line formats written as templates: literals and variables, nginx's `log_format` syntax
//! (`$remote_addr - $remote_user [$time_local] "$request" ...`) or Envoy's
//! (`[%START_TIME%] "%REQ(:METHOD)% ..."`). A line is matched against the template left to
//! right: a literal must be there, a variable runs up to the next occurrence of the literal
//! after it (inside double quotes, a quote escaped by a backslash does not end it); the last
//! variable of a template that ends with one takes the rest of the line, and whatever follows
//! the template's last literal is ignored (formats that append fields stay readable).
//! Matching is byte-level: one `memchr` per variable, no allocation.

use std::ops::Range;

/// The most variables a template may hold.
pub const MAX_VARS: usize = 64;

/// nginx's and Apache's `combined` format.
pub const COMBINED: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent""#;
/// The common log format (`combined` without referer and user agent).
pub const COMMON: &str =
    r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent"#;
/// Envoy's default access log format.
pub const ENVOY: &str = r#"[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%""#;
/// AWS Application Load Balancer access logs, up to `request_creation_time` (the fields
/// after it, added over the years, are ignored).
pub const ALB: &str = r#"$type $time $elb $client_port $target_port $request_processing_time $target_processing_time $response_processing_time $elb_status_code $target_status_code $received_bytes $sent_bytes "$request" "$user_agent" $ssl_cipher $ssl_protocol $target_group_arn "$trace_id" "$domain_name" "$chosen_cert_arn" $matched_rule_priority $request_creation_time "#;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Lit(Vec<u8>),
    /// A variable; `quoted`: between double quotes in the template.
    Var {
        quoted: bool,
    },
}

/// A compiled template.
#[derive(Clone, Debug)]
pub struct Template {
    pieces: Vec<Piece>,
    names: Vec<String>,
}

/// Where each variable of a matched line is.
pub type Spans = [Range<u32>; MAX_VARS];

impl Template {
    /// Compiles `text` (nginx `$name` / `${name}`, Envoy `%OPERATOR%` / `%REQ(HEADER)%`).
    pub fn compile(text: &str) -> crate::Result<Template> {
        let b = text.as_bytes();
        let mut pieces: Vec<Piece> = Vec::new();
        let mut names = Vec::new();
        let mut lit = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let var = match b[i] {
                b'$' => nginx_var(&b[i + 1..]).map(|(n, len)| (n, len + 1)),
                b'%' => envoy_var(&b[i + 1..]).map(|(n, len)| (n, len + 1)),
                _ => None,
            };
            let Some((name, len)) = var else {
                lit.push(b[i]);
                i += 1;
                continue;
            };
            if !lit.is_empty() {
                pieces.push(Piece::Lit(std::mem::take(&mut lit)));
            } else if matches!(pieces.last(), Some(Piece::Var { .. })) {
                return Err(format!(
                    "the log format has two variables with nothing between them before `{}`: \
                     a line could not be split there",
                    &text[i..i + len]
                )
                .into());
            }
            let quoted = matches!(pieces.last(), Some(Piece::Lit(l)) if l.ends_with(b"\""))
                && b.get(i + len) == Some(&b'"');
            pieces.push(Piece::Var { quoted });
            names.push(name);
            i += len;
        }
        if !lit.is_empty() {
            pieces.push(Piece::Lit(lit));
        }
        if names.is_empty() {
            return Err("the log format has no variable ($name or %OPERATOR%)".into());
        }
        if names.len() > MAX_VARS {
            return Err(format!("the log format has more than {MAX_VARS} variables").into());
        }
        Ok(Template { pieces, names })
    }

    /// The variables' names, in order (nginx names as written; Envoy operators as
    /// [`envoy_name`] spells them).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Matches `line`, filling `spans` (indexes of [`Template::names`]); on failure, why.
    #[inline]
    pub fn parse(&self, line: &[u8], spans: &mut Spans) -> Result<(), &'static str> {
        let mut at = 0usize;
        let mut v = 0usize;
        let n = self.pieces.len();
        for (k, p) in self.pieces.iter().enumerate() {
            match p {
                Piece::Lit(l) => {
                    if !starts_with(&line[at..], l) {
                        return Err(if at == 0 {
                            "the line does not start as the format does"
                        } else {
                            "the line does not follow the format"
                        });
                    }
                    at += l.len();
                }
                Piece::Var { quoted } => {
                    let end = match self.pieces.get(k + 1) {
                        Some(Piece::Lit(l)) => find(&line[at..], l, *quoted)
                            .map(|i| at + i)
                            .ok_or("the line ends before the format does")?,
                        _ => line.len(),
                    };
                    spans[v] = at as u32..end as u32;
                    v += 1;
                    at = end;
                }
            }
            debug_assert!(k < n);
        }
        Ok(())
    }
}

/// The first occurrence of `lit` in `hay`; `quoted`: skipping quotes escaped by a backslash.
#[inline]
fn find(hay: &[u8], lit: &[u8], quoted: bool) -> Option<usize> {
    let first = lit[0];
    let mut from = 0;
    loop {
        let i = from + memchr::memchr(first, &hay[from..])?;
        let escaped = quoted && first == b'"' && {
            let bs = hay[..i].iter().rev().take_while(|&&c| c == b'\\').count();
            bs % 2 == 1
        };
        if !escaped && starts_with(&hay[i..], lit) {
            return Some(i);
        }
        from = i + 1;
    }
}

/// `h.starts_with(l)` for the short literals of log formats, byte by byte: the slice
/// comparison calls `memcmp`, which took 5 % of a replay (perf).
#[inline(always)]
fn starts_with(h: &[u8], l: &[u8]) -> bool {
    h.len() >= l.len() && h.iter().zip(l).all(|(a, b)| a == b)
}

/// `name` or `{name}` after a `$`: (name, bytes taken).
fn nginx_var(b: &[u8]) -> Option<(String, usize)> {
    let ok = |c: &u8| c.is_ascii_alphanumeric() || *c == b'_';
    if b.first() == Some(&b'{') {
        let end = b.iter().position(|&c| c == b'}')?;
        let n = &b[1..end];
        return (!n.is_empty() && n.iter().all(ok))
            .then(|| (String::from_utf8_lossy(n).into_owned(), end + 1));
    }
    let n = b.iter().take_while(|c| ok(c)).count();
    (n > 0).then(|| (String::from_utf8_lossy(&b[..n]).into_owned(), n))
}

/// `OPERATOR%` or `OPERATOR(ARG)%` or `OPERATOR(ARG):LEN%` after a `%`: (name, bytes taken).
fn envoy_var(b: &[u8]) -> Option<(String, usize)> {
    let mut i = b
        .iter()
        .take_while(|c| c.is_ascii_uppercase() || **c == b'_')
        .count();
    if i == 0 {
        return None;
    }
    if b.get(i) == Some(&b'(') {
        i += b[i..].iter().position(|&c| c == b')')? + 1;
    }
    if b.get(i) == Some(&b':') {
        i += 1 + b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
    }
    if b.get(i) != Some(&b'%') {
        return None;
    }
    let op = std::str::from_utf8(&b[..i]).ok()?;
    Some((envoy_name(op), i + 1))
}

/// The field name of an Envoy operator: `REQ(:METHOD)` is `request_method`,
/// `REQ(X-ENVOY-ORIGINAL-PATH?:PATH)` and `REQ(:PATH)` are `path`, `REQ(:AUTHORITY)` is
/// `authority`, `REQ(X-FOO)` is `http_x_foo` (nginx's name for a request header),
/// `RESP(X-FOO)` is `resp_x_foo`, any other operator its lower-case name (`START_TIME(...)`
/// is `start_time`).
pub fn envoy_name(op: &str) -> String {
    let (head, arg) = match op.split_once('(') {
        Some((h, rest)) => (h, rest.split(')').next().unwrap_or("")),
        None => (op, ""),
    };
    let header = |h: &str| h.to_ascii_lowercase().replace('-', "_");
    // The header used, not the fallback after `?`.
    let main = arg.split('?').next().unwrap_or("");
    match (head, main.to_ascii_uppercase().as_str()) {
        ("REQ", ":METHOD") => "request_method".into(),
        ("REQ", ":PATH") | ("REQ", "X-ENVOY-ORIGINAL-PATH") => "path".into(),
        ("REQ", ":AUTHORITY") => "authority".into(),
        ("REQ", h) => format!("http_{}", header(h.trim_start_matches(':'))),
        ("RESP", h) => format!("resp_{}", header(h.trim_start_matches(':'))),
        (op, _) => op.to_ascii_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(t: &Template, line: &str) -> Result<Vec<(String, String)>, &'static str> {
        let mut s: Spans = std::array::from_fn(|_| 0..0);
        t.parse(line.as_bytes(), &mut s)?;
        Ok(t.names()
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    n.clone(),
                    line[s[i].start as usize..s[i].end as usize].to_string(),
                )
            })
            .collect())
    }

    #[test]
    fn combined() {
        let t = Template::compile(COMBINED).unwrap();
        let line = r#"203.0.113.9 - 42 [10/Oct/2000:13:55:36 -0700] "GET /a?b=1 HTTP/1.1" 200 2326 "-" "curl/8 \"x\" y" extra"#;
        let f = fields(&t, line).unwrap();
        assert_eq!(f[0], ("remote_addr".into(), "203.0.113.9".into()));
        assert_eq!(f[1].1, "42");
        assert_eq!(f[2].1, "10/Oct/2000:13:55:36 -0700");
        assert_eq!(f[3].1, "GET /a?b=1 HTTP/1.1");
        assert_eq!(f[7].1, r#"curl/8 \"x\" y"#);
        assert!(fields(&t, "garbage").is_err());
        assert!(fields(&t, r#"1.2.3.4 - - [x] "GET"#).is_err());
    }

    #[test]
    fn envoy_and_alb() {
        let t = Template::compile(ENVOY).unwrap();
        assert_eq!(
            &t.names()[..4],
            ["start_time", "request_method", "path", "protocol"]
        );
        assert!(t.names().contains(&"http_x_forwarded_for".to_string()));
        let line = r#"[2016-04-15T20:17:00.310Z] "POST /api/v1/locations HTTP/2" 204 - 154 0 226 100 "10.0.35.28" "nsq2http" "cc21d9b0-cf5c-432b-8c7e-98aeb7988cd2" "locations" "tcp://10.0.2.1:80""#;
        let f = fields(&t, line).unwrap();
        assert_eq!(f[2].1, "/api/v1/locations");
        assert_eq!(f[14].1, "tcp://10.0.2.1:80");
        let t = Template::compile(ALB).unwrap();
        let line = r#"http 2018-07-02T22:23:00.186641Z app/my-loadbalancer/50dc6c495c0c9188 192.168.131.39:2817 10.0.0.1:80 0.000 0.001 0.000 200 200 34 366 "GET http://www.example.com:80/ HTTP/1.1" "curl/7.46.0" - - arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 "Root=1-58337262-36d228ad5d99923122bbe354" "-" "-" 0 2018-07-02T22:22:48.364000Z "forward" "-" "-" "10.0.0.1:80" "200" "-" "-""#;
        let f = fields(&t, line).unwrap();
        assert_eq!(f[3].1, "192.168.131.39:2817");
        assert_eq!(f[12].1, "GET http://www.example.com:80/ HTTP/1.1");
        assert_eq!(f[21].1, "2018-07-02T22:22:48.364000Z");
    }

    #[test]
    fn bad_templates() {
        assert!(Template::compile("$a$b").is_err());
        assert!(Template::compile("no variables").is_err());
        assert!(Template::compile("${a} ${b}").is_ok());
        assert_eq!(envoy_name("REQ(X-Customer-Id)"), "http_x_customer_id");
        assert_eq!(envoy_name("START_TIME(%s)"), "start_time");
        let t = Template::compile("[%START_TIME(%s.%3f)%] %REQ(X-ID):10%").unwrap();
        assert_eq!(t.names(), ["start_time", "http_x_id"]);
    }
}
