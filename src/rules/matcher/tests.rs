use super::*;
use crate::rules::model::Rule;

fn rule(prefixes: &[&str]) -> Rule {
    let mut r = Rule::new("r", KeyClass::global());
    r.when.route_prefixes = prefixes.iter().map(|s| s.to_string()).collect();
    r
}

#[test]
fn longest_prefix_lists() {
    let rules = vec![
        rule(&[]),
        rule(&["/v1/"]),
        rule(&["/v1/charges"]),
        rule(&["/v1/charges/refunds", "/v2/"]),
        rule(&["/v1/cust"]),
        rule(&["/v1/\0\0", "/v1/charges/refunds/x/y"]),
    ];
    let t = RouteTable::build(&rules);
    let c = |r: Option<&str>| {
        t.candidates(r)
            .enforce
            .iter()
            .map(|c| c.rule)
            .collect::<Vec<_>>()
    };
    assert_eq!(c(None), vec![0]);
    assert_eq!(c(Some("/health")), vec![0]);
    assert_eq!(c(Some("/v1")), vec![0]);
    assert_eq!(c(Some("/v1/")), vec![0, 1]);
    assert_eq!(c(Some("/v1/balance")), vec![0, 1]);
    assert_eq!(c(Some("/v1/charges")), vec![0, 1, 2]);
    assert_eq!(c(Some("/v1/charges/x")), vec![0, 1, 2]);
    assert_eq!(c(Some("/v1/charges/refunds/9")), vec![0, 1, 2, 3]);
    assert_eq!(c(Some("/v1/customers")), vec![0, 1, 4]);
    assert_eq!(c(Some("/v1/d")), vec![0, 1]);
    assert_eq!(c(Some("/v2/x")), vec![0, 3]);
    assert_eq!(c(Some("/zzz")), vec![0]);
    assert_eq!(c(Some("")), vec![0]);
    assert_eq!(c(Some("/v1/charges/refund")), vec![0, 1, 2]);
    assert_eq!(c(Some("/v1/c")), vec![0, 1]);
    assert_eq!(c(Some("/v1/\0")), vec![0, 1]);
    assert_eq!(c(Some("/v2/")), vec![0, 3]);
    assert_eq!(c(Some("/v2")), vec![0]);
}

proptest::proptest! {
    /// The table against the definition: rule i is a candidate iff it has no route
    /// condition or one of its prefixes is a prefix of the route.
    #[test]
    fn table_matches_naive(
        sets in proptest::collection::vec(proptest::collection::vec("[/ab\\x00]{0,10}", 0..3), 1..8),
        routes in proptest::collection::vec("[/ab\\x00]{0,12}", 1..20),
    ) {
        let rules: Vec<Rule> = sets
            .iter()
            .map(|ps| rule(&ps.iter().filter(|p| !p.is_empty()).map(|s| s.as_str()).collect::<Vec<_>>()))
            .collect();
        let t = RouteTable::build(&rules);
        for r in &routes {
            let want: Vec<u32> = (0..rules.len() as u32)
                .filter(|&i| {
                    let w = &rules[i as usize].when.route_prefixes;
                    w.is_empty() || w.iter().any(|p| r.starts_with(p.as_str()))
                })
                .collect();
            let got: Vec<u32> = t.candidates(Some(r)).enforce.iter().map(|c| c.rule).collect();
            proptest::prop_assert_eq!(got, want, "route {:?}", r);
        }
    }
}

/// A route's filtered lists against its full lists: for every (method, priority) pair,
/// the picked candidates filtered by their masks are the full list filtered by them, and
/// exactly that list unless the route is over budget; `single` and `uniform` hold as
/// documented.
fn check_picked(c: &Cands) {
    let ids = |l: &[Cand], s: u32| -> Vec<u32> {
        l.iter().filter(|c| c.admits(s)).map(|c| c.rule).collect()
    };
    let over = c.lists.len() == 1 && !c.uniform;
    for s in 0..SELS as u32 {
        let p = c.picked(s);
        for (picked, full) in [(&p.enforce, &c.enforce), (&p.shadow, &c.shadow)] {
            assert_eq!(ids(picked, s), ids(full, s), "sel {s}");
            if !over {
                let all: Vec<u32> = picked.iter().map(|c| c.rule).collect();
                assert_eq!(all, ids(full, s), "sel {s}: exactly the admitting ones");
            }
        }
        assert_eq!(
            p.single,
            !over && ids(&c.enforce, s).len() == 1 && ids(&c.shadow, s).is_empty()
        );
        assert_eq!(c.single(s), p.single.then(|| p.enforce[0].rule), "sel {s}");
        if c.uniform {
            assert!(std::ptr::eq(p, c.picked(0)));
            assert!(p
                .enforce
                .iter()
                .chain(p.shadow.iter())
                .all(|x| (0..SELS as u32).all(|t| x.admits(t))));
        }
    }
}

proptest::proptest! {
    #[test]
    fn picked_lists_are_the_filtered_lists(
        conds in proptest::collection::vec((0u16..1 << 9, 0u8..16, proptest::bool::ANY, 0u8..3), 1..10),
        routes in proptest::collection::vec("[/ab]{0,6}", 1..10),
    ) {
        let rules: Vec<Rule> = conds
            .iter()
            .map(|&(methods, prios, shadow, route)| {
                let mut r = rule(&[["", "/a", "/ab/"][route as usize]].into_iter().filter(|p| !p.is_empty()).collect::<Vec<_>>());
                if methods & 1 == 1 {
                    r.when.methods = (0..9).filter(|b| methods >> b & 1 == 1).map(|b| super::super::request::METHODS[b].to_string()).collect();
                }
                r.when.priorities = Priority::ALL.into_iter().filter(|p| prios & p.bit() != 0).collect();
                if shadow {
                    r.mode = super::super::model::Mode::Shadow;
                }
                r
            })
            .collect();
        let t = RouteTable::build(&rules);
        check_picked(&t.unrouted);
        for r in &routes {
            check_picked(t.candidates(Some(r)));
        }
    }
}

#[test]
fn over_budget_routes_keep_one_unfiltered_list() {
    // 600 rules without conditions and one per method: ten distinct lists of 600+.
    let mut rules: Vec<Rule> = (0..600).map(|_| rule(&[])).collect();
    for m in super::super::request::METHODS {
        let mut r = rule(&[]);
        r.when.methods = vec![m.to_string()];
        rules.push(r);
    }
    let t = RouteTable::build(&rules);
    assert_eq!(t.unrouted.lists.len(), 1);
    assert!(!t.unrouted.uniform);
    check_picked(&t.unrouted);
}

#[test]
fn composite_ids_differ_by_part() {
    let h = KeyHasher::with_seed(7, 64);
    let cr = KeyClass::customer().and(KeyPart::Route);
    let a = Request::new().customer(1).route("/a");
    let b = Request::new().customer(1).route("/b");
    assert_ne!(key_id(cr, &a, &h), key_id(cr, &b, &h));
    assert_eq!(key_id(cr, &Request::new().customer(1), &h), None);
    assert_eq!(key_id(KeyClass::customer(), &a, &h), Some(1));
    let ip = KeyClass::ip().ip_prefix(24, 48);
    let x = Request::new().ip("10.1.2.3".parse::<IpAddr>().unwrap());
    let y = Request::new().ip("10.1.2.200".parse::<IpAddr>().unwrap());
    assert_eq!(key_id(ip, &x, &h), Some(0x0a01_0200));
    assert_eq!(key_id(ip, &x, &h), key_id(ip, &y, &h));
    let m = Request::new().ip("::ffff:10.1.2.9".parse::<IpAddr>().unwrap());
    assert_eq!(key_id(ip, &m, &h), Some(0x0a01_0200));
}
