use super::*;
use crate::egress::split_credentials;

fn interceptor() -> Interceptor {
    let cred = split_credentials("https://alice:tok3n-secret@idx.example/simple")
        .expect("splits")
        .1
        .expect("credentials");
    Interceptor::new(vec![cred], None).expect("minted")
}

#[test]
fn only_hosts_with_credentials_are_intercepted() {
    let i = interceptor();
    let host = crate::egress::normalize_host("idx.example").expect("host");
    assert!(i.covers(&host, 443));
    assert!(
        !i.covers(&host, 8443),
        "another port is tunnelled as before"
    );
    let other = crate::egress::normalize_host("pypi.org").expect("host");
    assert!(!i.covers(&other, 443));
}

#[test]
fn the_trust_bundle_ends_with_the_minted_ca_and_holds_no_secret() {
    let i = interceptor();
    let bundle = i.trust_bundle(None).expect("bundle");
    assert!(bundle.trim_end().ends_with("-----END CERTIFICATE-----"));
    assert!(bundle.contains(i.ca_pem.trim()));
    assert!(!bundle.contains("tok3n-secret") && !bundle.contains("PRIVATE KEY"));
    let shown = format!("{i:?}");
    assert!(!shown.contains("tok3n"), "{shown}");
}

#[test]
fn a_leaf_is_made_once_per_host() {
    let i = interceptor();
    let host = crate::egress::normalize_host("idx.example").expect("host");
    let a = i.leaf(&host).expect("leaf");
    let b = i.leaf(&host).expect("leaf");
    assert!(Arc::ptr_eq(&a, &b));
    let ip = crate::egress::normalize_host("127.0.0.1").expect("ip");
    i.leaf(&ip).expect("a leaf for an IP literal");
}
