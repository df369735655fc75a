//! TEMPORARY stub until the metrics branch is merged.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";
pub struct TenantCounts {
    pub tenant: String,
    pub sessions_by_state: Vec<(&'static str, u64)>,
    pub jobs_by_state: Vec<(&'static str, u64)>,
}
pub fn render(tenants: &[TenantCounts], draining: bool) -> String {
    let mut s = format!("ferrepl_up 1\nferrepl_draining {}\n", u8::from(draining));
    for t in tenants {
        for (k, v) in &t.sessions_by_state {
            s.push_str(&format!(
                "ferrepl_sessions{{tenant=\"{}\",state=\"{k}\"}} {v}\n",
                t.tenant
            ));
        }
        let _ = &t.jobs_by_state;
    }
    s
}
impl crate::session::SessionManager {
    pub fn state_counts(&self) -> Vec<(&'static str, u64)> {
        vec![("all", self.session_count() as u64)]
    }
}
impl crate::jobs::JobManager {
    pub fn state_counts(&self) -> Vec<(&'static str, u64)> {
        vec![("all", self.list().len() as u64)]
    }
}
