use super::*;

const A: &str = "aaaaaaaaaaaaaaaaaaaa";
const A2: &str = "aaaaaaaaaaaaaaaaaaa2";
const B: &str = "bbbbbbbbbbbbbbbbbbbb";
const B2: &str = "bbbbbbbbbbbbbbbbbbb2";

fn access(tokens: &str) -> Access {
    let table = TokenTable::parse(tokens).expect("tokens");
    Access::new(Some(table), Some(PathBuf::from("/viewer-tokens")))
}

fn with_cookie(login: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let value = format!("x=1; {COOKIE}={login}");
    headers.insert(header::COOKIE, value.parse().expect("header"));
    headers
}

fn named(name: &str) -> Tenant {
    Tenant::Named(name.into())
}

/// SIGHUP with `tokens` as the new file: the tenants whose logins ended.
fn sighup(access: &Access, tokens: &str) -> Vec<(Tenant, usize)> {
    let text = tokens.to_string();
    access
        .reload(|_| TokenTable::parse(&text).map_err(anyhow::Error::msg))
        .expect("reload");
    access.end_logins(|_| true)
}

#[test]
fn a_ticket_logs_in_once_and_a_cookie_names_its_tenant() {
    let access = access(&format!("{A} alice\n{B} bob\n"));
    let alice = named("alice");
    let ticket = access.ticket(&alice).expect("ticket");
    let login = access.login(Some(&ticket), None, |_| true).expect("login");
    assert!(
        access.login(Some(&ticket), None, |_| true).is_none(),
        "single use"
    );
    assert_eq!(access.tenant_of(&with_cookie(&login)), Some(alice));
    let by_token = access.login(None, Some(B), |_| true).expect("token login");
    assert_eq!(
        access.tenant_of(&with_cookie(&by_token)),
        Some(named("bob"))
    );
    assert!(
        access
            .login(None, Some("wrong-token-wrong-token"), |_| true)
            .is_none()
    );
    assert_eq!(access.tenant_of(&with_cookie(&"0".repeat(64))), None);
    assert_eq!(access.tenant_of(&HeaderMap::new()), None);
}

#[test]
fn a_rotated_token_ends_the_logins_made_with_it_and_a_changed_tenant_its_tickets() {
    const C: &str = "cccccccccccccccccccc";
    let access = access(&format!("{A} alice\n{A2} alice\n{B} bob\n{C} carol\n"));
    let (alice, bob, carol) = (named("alice"), named("bob"), named("carol"));
    let by_a = access.login(None, Some(A), |_| true).expect("a");
    let by_a2 = access.login(None, Some(A2), |_| true).expect("a2");
    let by_b = access.login(None, Some(B), |_| true).expect("b");
    let by_ticket = |tenant: &Tenant| {
        let ticket = access.ticket(tenant).expect("ticket");
        access
            .login(Some(&ticket), None, |_| true)
            .expect("ticket login")
    };
    let (alice_t, bob_t, carol_t) = (by_ticket(&alice), by_ticket(&bob), by_ticket(&carol));
    let cut = |login: &str, tenant: &Tenant| {
        access
            .ended(&with_cookie(login), tenant, |_| true)
            .expect("a live login")
    };
    let cuts = [
        cut(&by_a, &alice),
        cut(&by_b, &bob),
        cut(&bob_t, &bob),
        cut(&alice_t, &alice),
    ];
    let (kept_a2, kept_carol) = (cut(&by_a2, &alice), cut(&carol_t, &carol));
    let late_ticket = access.ticket(&bob).expect("ticket");

    // A is gone (A2 stays), B becomes B2, carol's tokens stay.
    let gone = sighup(&access, &format!("{A2} alice\n{B2} bob\n{C} carol\n"));
    assert!(gone.contains(&(alice.clone(), 2)), "{gone:?}");
    assert!(gone.contains(&(bob.clone(), 2)), "{gone:?}");
    assert_eq!(gone.len(), 2, "{gone:?}");
    let is = |login: &str| access.tenant_of(&with_cookie(login));
    assert_eq!(is(&by_a), None);
    assert_eq!(
        is(&by_a2),
        Some(alice.clone()),
        "its token is still alice's"
    );
    assert_eq!(is(&by_b), None);
    assert_eq!(is(&alice_t), None, "alice's tokens changed");
    assert_eq!(is(&bob_t), None);
    assert_eq!(is(&carol_t), Some(carol.clone()), "carol's did not");
    assert!(cuts.iter().all(CancellationToken::is_cancelled));
    assert!(!kept_a2.is_cancelled() && !kept_carol.is_cancelled());
    assert!(
        access.login(Some(&late_ticket), None, |_| true).is_none(),
        "a ticket printed with bob's old tokens"
    );
    assert!(access.login(None, Some(B), |_| true).is_none());
    assert!(access.login(None, Some(B2), |_| true).is_some());

    // A token moved to another tenant does not keep its logins.
    let by_a2_again = access.login(None, Some(A2), |_| true).expect("a2");
    sighup(&access, &format!("{A2} bob\n{B2} alice\n{C} carol\n"));
    assert_eq!(is(&by_a2_again), None);
    assert_eq!(is(&carol_t), Some(carol));
}

#[test]
fn rotating_a_bare_token_ends_its_logins() {
    let access = access(&format!("{A}\n"));
    let old = access.login(None, Some(A), |_| true).expect("a");
    let ticket = access.ticket(&Tenant::Sole).expect("ticket");
    let by_ticket = access.login(Some(&ticket), None, |_| true).expect("t");
    assert_eq!(sighup(&access, &format!("{A}\n")), vec![]);
    assert_eq!(access.tenant_of(&with_cookie(&old)), Some(Tenant::Sole));
    assert_eq!(sighup(&access, &format!("{B}\n")), vec![(Tenant::Sole, 2)]);
    assert_eq!(access.tenant_of(&with_cookie(&old)), None);
    assert_eq!(access.tenant_of(&with_cookie(&by_ticket)), None);
}

#[test]
fn a_stream_never_starts_on_a_login_that_has_ended() {
    let access = access(&format!("{A} alice\n{B} bob\n"));
    let alice = named("alice");
    let login = access.login(None, Some(A), |_| true).expect("a");
    let headers = with_cookie(&login);
    // The request was let in as alice...
    assert_eq!(access.tenant_of(&headers), Some(alice.clone()));
    // ...then SIGHUP ended alice's logins before its stream began.
    sighup(&access, &format!("{B} bob\n"));
    assert!(access.ended(&headers, &alice, |_| true).is_none());
    // Revoked on the server (the viewer tokens as they were).
    let bob = named("bob");
    let login = access.login(None, Some(B), |_| true).expect("b");
    let headers = with_cookie(&login);
    assert!(access.ended(&headers, &bob, |t| t != &bob).is_none());
    assert!(
        access.ended(&headers, &alice, |_| true).is_none(),
        "not alice's"
    );
    let cut = access.ended(&headers, &bob, |_| true).expect("live");
    assert!(!cut.is_cancelled());
    assert_eq!(access.end_logins(|t| t != &bob), vec![(bob, 1)]);
    assert!(cut.is_cancelled());
    // Without viewer tokens a stream ends only with the server.
    let open = Access::new(None, None);
    assert!(
        open.ended(&HeaderMap::new(), &Tenant::Sole, |_| true)
            .is_some()
    );
}

#[test]
fn every_tenant_of_a_large_file_gets_a_working_ticket() {
    let n = MAX_TICKETS * 2;
    let tokens: String = (0..n)
        .map(|i| format!("token-number-{i:08} t{i}\n"))
        .collect();
    let access = access(&tokens);
    let tickets: Vec<(Tenant, String)> = access
        .tenants()
        .into_iter()
        .map(|t| {
            let ticket = access.ticket(&t).expect("ticket");
            (t, ticket)
        })
        .collect();
    assert_eq!(tickets.len(), n);
    for (tenant, ticket) in tickets {
        let login = access.login(Some(&ticket), None, |_| true).expect("login");
        assert_eq!(access.tenant_of(&with_cookie(&login)), Some(tenant));
    }
}

#[test]
fn each_tenant_holds_its_own_share_and_pushes_out_only_its_own_logins() {
    let access = access(&format!("{A} alice\n{B} bob\ncccccccccccccccccccc carol\n"));
    let share = login_share(3);
    assert_eq!(share, MAX_LOGINS / 3);
    assert_eq!(
        (login_share(1), login_share(2)),
        (MAX_LOGINS, MAX_LOGINS / 2)
    );
    assert_eq!(login_share(1000), MIN_LOGIN_SHARE);
    let bob = access.login(None, Some(B), |_| true).expect("bob");
    let first_carol = access
        .login(None, Some("cccccccccccccccccccc"), |_| true)
        .expect("carol");
    for _ in 0..MAX_LOGINS * 2 {
        access.login(None, Some(A), |_| true).expect("alice");
    }
    for _ in 1..share {
        access
            .login(None, Some("cccccccccccccccccccc"), |_| true)
            .expect("carol");
    }
    let count = |t: &str| {
        let logins = access.logins.lock().expect("lock");
        logins.values().filter(|l| l.tenant == named(t)).count()
    };
    assert_eq!(
        (count("alice"), count("bob"), count("carol")),
        (share, 1, share)
    );
    assert_eq!(access.tenant_of(&with_cookie(&bob)), Some(named("bob")));
    assert_eq!(
        access.tenant_of(&with_cookie(&first_carol)),
        Some(named("carol"))
    );
    // At its share, carol's own oldest goes.
    access
        .login(None, Some("cccccccccccccccccccc"), |_| true)
        .expect("carol");
    assert_eq!(access.tenant_of(&with_cookie(&first_carol)), None);
    assert_eq!(access.tenant_of(&with_cookie(&bob)), Some(named("bob")));
    assert_eq!(count("carol"), share);
}

#[test]
fn with_two_tenants_each_holds_half_and_revoked_logins_end_their_streams() {
    let access = access(&format!("{A} alice\n{B} bob\n"));
    let bob_login = access.login(None, Some(B), |_| true).expect("bob");
    for _ in 0..MAX_LOGINS {
        access.login(None, Some(A), |_| true).expect("alice");
    }
    let (alice, bob) = (named("alice"), named("bob"));
    assert_eq!(
        access.tenant_of(&with_cookie(&bob_login)),
        Some(bob.clone())
    );
    let alice_logins: Vec<String> = {
        let logins = access.logins.lock().expect("lock");
        logins
            .iter()
            .filter(|(_, l)| l.tenant == alice)
            .map(|(k, _)| k.clone())
            .collect()
    };
    assert_eq!(alice_logins.len(), MAX_LOGINS / 2);
    let cut = access
        .ended(&with_cookie(&alice_logins[0]), &alice, |_| true)
        .expect("alice");
    let kept = access
        .ended(&with_cookie(&bob_login), &bob, |_| true)
        .expect("bob");
    let gone = access.end_logins(|t| t != &alice);
    assert_eq!(gone, vec![(alice.clone(), MAX_LOGINS / 2)]);
    assert!(cut.is_cancelled() && !kept.is_cancelled());
    assert!(
        access.login(None, Some(A), |t| t != &alice).is_none(),
        "a tenant the server no longer serves"
    );
}

#[test]
fn without_tokens_every_request_is_the_sole_tenant() {
    let access = Access::new(None, None);
    assert_eq!(access.tenant_of(&HeaderMap::new()), Some(Tenant::Sole));
    assert!(access.login(None, Some("anything"), |_| true).is_none());
}
