//! Failed viewer logins counted per peer and overall, so a token cannot
//! be guessed at speed and a flood cannot lock out a person (see
//! [`Throttle`]). Tickets are never throttled (routes::log_in).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed logins per peer and overall, in fixed windows. A peer is an
/// address as [`peer_of`] groups them (all of loopback one peer, IPv6 by
/// its /64). A peer past its own count waits for its window's end; past
/// the overall count, so does every peer that failed itself in the
/// current window, never one that did not (a flood from elsewhere cannot
/// lock out a person who types the right token). Bounded: at most
/// [`MAX_PEERS`] peers are remembered; failures of peers past that are
/// counted together, and while any of those failed in the window, a peer
/// not remembered counts as one that failed.
#[derive(Default)]
pub struct Throttle {
    state: Mutex<ThrottleState>,
}

#[derive(Default)]
struct ThrottleState {
    peers: HashMap<IpAddr, Window>,
    /// Failures of peers not remembered (the map was full).
    unremembered: Window,
    all: Window,
}

#[derive(Default, Clone, Copy)]
struct Window {
    start: Option<Instant>,
    fails: u32,
}

const WINDOW: Duration = Duration::from_secs(60);
/// Failed logins a peer may make per window.
pub const PEER_FAILS: u32 = 10;
/// Failed logins of every peer together per window.
const ALL_FAILS: u32 = 100;
const MAX_PEERS: usize = 1024;

/// The peer an address is counted as: every loopback address (127.0.0.0/8
/// and ::1) is one, an IPv6 address is its /64, an IPv4-mapped IPv6
/// address its IPv4 address.
pub fn peer_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        ip if ip.is_loopback() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

impl Window {
    /// The failures in the window running at `now`, and its time left.
    fn current(&self, now: Instant) -> (u32, Duration) {
        match self.start {
            Some(s) if now.duration_since(s) < WINDOW => {
                (self.fails, WINDOW - now.duration_since(s))
            }
            _ => (0, WINDOW),
        }
    }

    fn fail(&mut self, now: Instant) {
        let (fails, _) = self.current(now);
        if fails == 0 {
            self.start = Some(now);
        }
        self.fails = fails.saturating_add(1);
    }
}

impl Throttle {
    /// Err(how long to wait) when `peer` failed too often, or everyone did
    /// and so did `peer`.
    pub fn check(&self, peer: IpAddr, now: Instant) -> Result<(), Duration> {
        let peer = peer_of(peer);
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (all, all_left) = state.all.current(now);
        let (mine, left) = match state.peers.get(&peer) {
            Some(w) => w.current(now),
            None => (state.unremembered.current(now).0.min(1), WINDOW),
        };
        if mine >= PEER_FAILS {
            Err(left)
        } else if mine > 0 && all >= ALL_FAILS {
            Err(all_left)
        } else {
            Ok(())
        }
    }

    pub fn fail(&self, peer: IpAddr, now: Instant) {
        let peer = peer_of(peer);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.all.fail(now);
        if !state.peers.contains_key(&peer) && state.peers.len() >= MAX_PEERS {
            state.peers.retain(|_, w| w.current(now).0 > 0);
        }
        if state.peers.contains_key(&peer) || state.peers.len() < MAX_PEERS {
            state.peers.entry(peer).or_default().fail(now);
        } else {
            state.unremembered.fail(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_one_peer_ipv6_a_64_and_mapped_ipv4_its_ipv4() {
        let p = |s: &str| peer_of(s.parse().expect("ip"));
        let lo = p("127.0.0.1");
        for same in ["127.0.0.2", "127.255.0.9", "::1", "::ffff:127.0.0.5"] {
            assert_eq!(p(same), lo, "{same}");
        }
        assert_eq!(p("2001:db8:1:2:aaaa::1"), p("2001:db8:1:2:ffff:1:2:3"));
        assert_ne!(p("2001:db8:1:2::1"), p("2001:db8:1:3::1"));
        assert_eq!(p("::ffff:192.0.2.7"), p("192.0.2.7"));
        assert_ne!(p("192.0.2.7"), p("192.0.2.8"));
    }

    #[test]
    fn failed_logins_wait_per_peer_and_other_loopback_addresses_are_the_same_peer() {
        let t = Throttle::default();
        let now = Instant::now();
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        for n in 0..PEER_FAILS {
            assert!(t.check(ip("127.0.0.1"), now).is_ok());
            t.fail(ip(&format!("127.0.0.{}", n + 2)), now);
        }
        let wait = t.check(ip("127.0.0.1"), now).expect_err("loopback waits");
        assert!(wait <= WINDOW && wait > Duration::ZERO);
        assert!(t.check(ip("::1"), now).is_err());
        for n in 0..PEER_FAILS {
            t.fail(ip(&format!("2001:db8::{n}")), now);
        }
        assert!(t.check(ip("2001:db8::ffff"), now).is_err(), "the same /64");
        assert!(t.check(ip("2001:db8:0:1::1"), now).is_ok(), "another /64");
        assert!(t.check(ip("10.0.0.2"), now).is_ok());
        assert!(
            t.check(ip("127.0.0.1"), now + WINDOW).is_ok(),
            "a new window"
        );
    }

    #[test]
    fn a_flood_from_elsewhere_never_refuses_an_address_that_has_not_failed() {
        let t = Throttle::default();
        let now = Instant::now();
        let (fresh, failed): (IpAddr, IpAddr) = (
            "10.9.9.9".parse().expect("ip"),
            "10.9.9.8".parse().expect("ip"),
        );
        t.fail(failed, now);
        for n in 0..ALL_FAILS as usize {
            t.fail(IpAddr::from([10, 1, (n >> 8) as u8, n as u8]), now);
        }
        assert!(t.check(fresh, now).is_ok(), "no failure of its own");
        assert!(
            t.check(failed, now).is_err(),
            "failed once, and everyone did"
        );
        t.fail(fresh, now);
        assert!(t.check(fresh, now).is_err());
        assert!(t.check(fresh, now + WINDOW).is_ok());
    }

    #[test]
    fn the_throttles_memory_is_bounded_and_peers_past_it_count_as_failed() {
        let t = Throttle::default();
        let now = Instant::now();
        let fresh: IpAddr = "10.9.9.9".parse().expect("ip");
        for n in 0..MAX_PEERS {
            t.fail(IpAddr::from([10, 1, (n >> 8) as u8, n as u8]), now);
        }
        assert!(t.check(fresh, now).is_ok());
        // Past the memory: the others are counted together and, once
        // everyone failed too often, a peer not remembered waits.
        let past: IpAddr = "10.2.0.1".parse().expect("ip");
        t.fail(past, now);
        assert!(t.check(past, now).is_err());
        assert!(t.check(fresh, now).is_err());
        assert!(t.check(fresh, now + WINDOW).is_ok());
        let state = t.state.lock().expect("lock");
        assert!(state.peers.len() <= MAX_PEERS);
    }
}
