use super::*;

fn fence(info: &str) -> Fence {
    Fence {
        file: "f.md".into(),
        line: 3,
        info: info.into(),
        body: Vec::new(),
    }
}

#[test]
fn fences_are_found_with_their_info_and_indented_ones_too() {
    let text = "# t\n\n```sh\na\nb \\\n  c\n```\n\n- item\n\n  ```text no\n  x\n  ```\n```\nopen";
    let e = fences("f.md", text).expect_err("the last fence is never closed");
    assert!(e.contains("f.md:14"), "{e}");
    let f = fences("f.md", &text[..text.len() - 9]).unwrap();
    assert_eq!(f.len(), 2);
    assert_eq!((f[0].line, f[0].info.as_str()), (3, "sh"));
    assert_eq!(commands(&f[0].body), ["a", "b    c"]);
    assert_eq!(
        (f[1].info.as_str(), f[1].body.as_slice()),
        ("text no", &["x".to_string()][..])
    );
}

#[test]
fn issue_numbers_are_found_as_grep_finds_them() {
    // Written with `#` for the space, so that a grep of the sources finds none.
    let text = |s: &str| s.replace('#', " ");
    for yes in [
        "Targets of issue#5",
        "(issues#13 and 15: before)",
        "Issue#20, defect 3",
    ] {
        assert!(names_an_issue(&text(yes)), "{yes}");
    }
    for no in ["an issue of layout", "issues: none", "issue ##5"] {
        assert!(!names_an_issue(&text(no)), "{no}");
    }
}

#[test]
fn inline_code_of_backticks_is_not_a_fence() {
    let text = "* ```` ```sh ```` is run\n  ```` ```sh ````.\n````md\n```sh\nx\n```\n````\n";
    let f = fences("f.md", text).unwrap();
    assert_eq!(f.len(), 1);
    assert_eq!((f[0].info.as_str(), f[0].body.len()), ("md", 3));
}

#[test]
fn kinds_by_info_string() {
    assert_eq!(fence("sh").kind(), Ok(Kind::Run(DEFAULT_TIMEOUT)));
    assert_eq!(
        fence("sh timeout=600").kind(),
        Ok(Kind::Run(Duration::from_secs(600)))
    );
    assert_eq!(
        fence("sh no-run: a Cluster of real hosts").kind(),
        Ok(Kind::NoRun("a Cluster of real hosts".into()))
    );
    assert!(fence("sh no-run")
        .kind()
        .unwrap_err()
        .contains("needs a reason"));
    assert!(fence("sh fast")
        .kind()
        .unwrap_err()
        .contains("unknown fence option `fast`"));
    for other in ["", "text", "rust", "toml", "shell"] {
        assert_eq!(fence(other).kind(), Ok(Kind::Other), "{other}");
    }
}

#[test]
fn comments_and_blank_lines_are_not_commands() {
    let body: Vec<String> = ["# a comment", "", "echo 1   # trailing", "  # indented"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(commands(&body), ["echo 1   # trailing"]);
}

#[test]
fn comments_are_cut_outside_quotes_only() {
    assert_eq!(strip_comment("a b   # c"), "a b");
    assert_eq!(
        strip_comment(r##"curl -d '{"a":"#1"}' x # y"##),
        r##"curl -d '{"a":"#1"}' x"##
    );
    assert_eq!(strip_comment("echo a#b"), "echo a#b");
    assert_eq!(strip_comment("# all"), "");
}

#[test]
fn servers_are_recognised_with_their_ports() {
    let s = step("cargo run --release -- serve --rules examples/rules.toml     # RESP on :6380");
    assert_eq!(s.server_ports, Some(vec![6380, 8080]));
    assert_eq!(
        s.run,
        "cargo run --release -- serve --rules examples/rules.toml"
    );
    let s = step("turnstile serve --rules r.toml --resp 127.0.0.1:6381 --http 127.0.0.1:8081 &");
    assert_eq!(s.server_ports, Some(vec![6381, 8081]));
    assert!(!s.run.ends_with('&'));
    let s = step("turnstile serve --grpc 127.0.0.1:8081 --envoy-config examples/envoy/");
    assert_eq!(s.server_ports, Some(vec![6380, 8080, 8081]));
    let s =
        step("redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes");
    assert_eq!(s.server_ports, Some(vec![6379]));
    assert!(!s.run.contains("daemonize"), "{}", s.run);
    let s =
        step("cargo run --release -p turnstile-tower --example axum -- --addr 127.0.0.1:3000 &");
    assert_eq!(s.server_ports, Some(vec![3000]));
    let s = step("cargo run --release -p turnstile-tower --example axum -- --addr 127.0.0.1:3000");
    assert_eq!(s.server_ports, Some(vec![3000]));
    assert!(s.run.ends_with("3000"), "{}", s.run);
    for not in [
        "redis-cli -p 6380 CL.THROTTLE user:1 15 30 60",
        "curl -s localhost:8080/metrics",
        "turnstile rules check examples/rules.toml",
        "cargo run --release -- bench",
        "echo serve",
    ] {
        assert_eq!(step(not).server_ports, None, "{not}");
    }
}

#[test]
fn a_script_marks_each_step_and_waits_for_servers() {
    let steps = [step("turnstile serve"), step("redis-cli -p 6380 PING")];
    let s = script(&steps);
    assert!(
        s.contains("__step 0\nturnstile serve &\n__wait_ports $! 6380 8080\n"),
        "{s}"
    );
    assert!(
        s.contains("__step 1\nredis-cli -p 6380 PING\n__step done\n"),
        "{s}"
    );
}

#[test]
fn judging_names_the_failing_command() {
    let steps = [step("echo a"), step("false"), step("redis-cli PING")];
    let t = Duration::from_secs(1);
    let log = "\n\u{1e}xtask-step 0\na\n\n\u{1e}xtask-step 1\n";
    assert_eq!(
        judge(&steps, log, Some(false), t),
        Some("`false` failed".into())
    );
    assert!(judge(&steps, log, None, t)
        .unwrap()
        .starts_with("timed out after 1 s in `false`"));
    let ok = "\n\u{1e}xtask-step 0\na\n\u{1e}xtask-step 2\nPONG\n\u{1e}xtask-step done\n";
    assert_eq!(judge(&steps, ok, Some(true), t), None);
    let err = ok.replace("PONG", "ERR unknown command 'PONG'");
    assert!(judge(&steps, &err, Some(true), t)
        .unwrap()
        .contains("`redis-cli PING` answered an error"));
    assert!(judge(&steps, "\n\u{1e}xtask-step 0\n", Some(true), t)
        .unwrap()
        .starts_with("stopped in"));
}

/// End to end on bash itself: a job the fence leaves in the background is stopped with
/// its group, and a failing command is named.
#[test]
fn a_fence_runs_in_its_own_group_and_leaves_the_tree_clean() {
    let root = std::env::temp_dir().join(format!("xtask-fence-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let f = Fence {
        file: "t.md".into(),
        line: 1,
        info: "sh".into(),
        body: vec!["sleep 600 &".into(), "echo $! > pid".into()],
    };
    let path = std::env::var("PATH").unwrap();
    let o = run_fence(&root, &f, Duration::from_secs(20), &path);
    assert_eq!(o.failure, None, "{}", o.log);
    let pid = std::fs::read_to_string(root.join("pid")).unwrap();
    // The background sleep was stopped with the group.
    let alive = Command::new("kill")
        .args(["-0", pid.trim()])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(!alive, "the fence's background job outlived it");
    let failing = Fence {
        body: vec!["true".into(), "exit 3".into(), "echo never".into()],
        ..f
    };
    let o = run_fence(&root, &failing, Duration::from_secs(20), &path);
    assert_eq!(o.failure.as_deref(), Some("`exit 3` failed"), "{}", o.log);
    std::fs::remove_dir_all(&root).unwrap();
}
