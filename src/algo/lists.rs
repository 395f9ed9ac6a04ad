//! What the compiler cannot check when an algorithm is added: that it is in
//! [`Algorithm::ALL`], named and parsed back, and documented. The `match` below does not
//! compile until a new variant is listed in it, which brings whoever adds one here.

use super::Algorithm;

/// Every algorithm's place in [`Algorithm::ALL`]: a new variant must be added here (the match
/// is exhaustive inside the crate), and then to `ALL` for the test to pass.
fn position(a: Algorithm) -> usize {
    match a {
        Algorithm::FixedWindow => 0,
        Algorithm::SlidingLog => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::WindowRing => 3,
        Algorithm::TokenBucket => 4,
        Algorithm::LeakyBucket => 5,
        Algorithm::Concurrency => 6,
    }
}

const ALGORITHMS_MD: &str = include_str!("../../docs/algorithms.md");
const RULES_MD: &str = include_str!("../../docs/rules.md");

#[test]
fn every_algorithm_is_listed_named_and_documented() {
    for (i, a) in Algorithm::ALL.iter().enumerate() {
        assert_eq!(position(*a), i, "{a} is out of place in Algorithm::ALL");
        assert_eq!(a.name().parse::<Algorithm>(), Ok(*a), "{a}'s name");
        let section = format!("\n## {}", a.name());
        assert!(
            ALGORITHMS_MD.contains(&section),
            "docs/algorithms.md has no section `## {}`",
            a.name()
        );
        assert!(
            RULES_MD.contains(&format!("`{}`", a.name())) || RULES_MD.contains(a.name()),
            "docs/rules.md does not name {}",
            a.name()
        );
    }
    // Every variant is in ALL: each position is taken once.
    let mut seen = [false; Algorithm::ALL.len()];
    for a in Algorithm::ALL {
        assert!(!seen[position(a)], "{a} twice in Algorithm::ALL");
        seen[position(a)] = true;
    }
}
