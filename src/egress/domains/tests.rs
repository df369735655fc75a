use super::*;

fn pattern(raw: &str) -> DomainPattern {
    DomainPattern::parse(raw).unwrap_or_else(|e| panic!("{raw}: {e}"))
}

fn host(raw: &str) -> Host {
    normalize_host(raw).unwrap_or_else(|| panic!("{raw} is a host"))
}

#[test]
fn exact_names_admit_only_themselves_on_80_and_443() {
    let p = pattern(" API.Example.com. ");
    assert_eq!(p.to_string(), "api.example.com");
    for (h, port, admitted) in [
        ("api.example.com", 443, true),
        ("API.EXAMPLE.COM.", 80, true),
        ("api.example.com", 8443, false),
        ("example.com", 443, false),
        ("x.api.example.com", 443, false),
        ("evilapi.example.com", 443, false),
    ] {
        assert_eq!(p.admits(&host(h), port), admitted, "{h}:{port}");
    }
}

#[test]
fn one_star_admits_subdomains_two_stars_also_the_apex() {
    let sub = pattern("*.example.com");
    let both = pattern("**.example.com");
    for (h, by_sub, by_both) in [
        ("example.com", false, true),
        ("a.example.com", true, true),
        ("a.b.example.com", true, true),
        ("aexample.com", false, false),
        ("example.com.evil.org", false, false),
        ("com", false, false),
    ] {
        assert_eq!(sub.admits(&host(h), 443), by_sub, "*. and {h}");
        assert_eq!(both.admits(&host(h), 443), by_both, "**. and {h}");
    }
    assert_eq!(both.to_string(), "**.example.com");
}

#[test]
fn a_port_replaces_the_defaults() {
    let p = pattern("**.example.com:8443");
    assert_eq!(p.to_string(), "**.example.com:8443");
    assert!(p.admits(&host("example.com"), 8443));
    assert!(!p.admits(&host("example.com"), 443));
    assert!(!p.admits(&host("example.com"), 80));
}

#[test]
fn ip_literals_match_exactly_and_never_by_name() {
    let v4 = pattern("10.0.0.5:8080");
    assert!(v4.admits(&host("10.0.0.5"), 8080));
    assert!(!v4.admits(&host("10.0.0.6"), 8080));
    let v6 = pattern("[fd00::1]:9000");
    assert!(v6.admits(&host("[FD00:0::1]"), 9000));
    let bare = pattern("2001:db8::5");
    assert!(bare.admits(&host("[2001:db8::5]"), 443));
    assert!(!bare.admits(&host("[::ffff:32.1.13.184]"), 443));
    // A wildcard name never admits an address that looks like its suffix.
    assert!(!pattern("**.0.0.1.example").admits(&host("127.0.0.1"), 80));
}

#[test]
fn malformed_patterns_are_refused_with_the_reason() {
    for (raw, why) in [
        ("", "empty"),
        ("   ", "empty"),
        ("*", "alone"),
        ("**", "alone"),
        ("*.", "alone"),
        ("**.", "alone"),
        ("*:443", "alone"),
        (".", "alone"),
        ("*.com", "top-level"),
        ("**.org", "top-level"),
        ("api.*.example.com", "wildcard may only open"),
        ("*example.com", "wildcard may only open"),
        ("***.example.com", "wildcard may only open"),
        ("a.example.*", "wildcard may only open"),
        ("*.10.0.0.1", "IP address cannot take a wildcard"),
        ("**.[fd00::1]", "IP address cannot take a wildcard"),
        ("example.com:0", "not a port"),
        ("example.com:65536", "not a port"),
        ("example.com:", "not a port"),
        ("example.com:http", "not a port"),
        ("[fd00::1", "closing ]"),
        ("[fd00::1]x", "after the ]"),
        ("[fd00::1%eth0]", "not a host"),
        ("exa mple.com", "not a host"),
        ("example.com/path", "not a host"),
        ("https://example.com", "not a port"),
        ("user@example.com", "not a host"),
        ("a..b", "not a host"),
    ] {
        match DomainPattern::parse(raw) {
            Ok(p) => panic!("{raw:?} was taken as {p}"),
            Err(e) => assert!(e.contains(why), "{raw:?}: {e:?} does not say {why:?}"),
        }
    }
}
