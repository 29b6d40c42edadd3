//! A gauge computed when scraped: seconds until the current certificate
//! expires (kubelet's `..._ttl_seconds` gauge functions), +Inf without one.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Gauge, Opts};

use super::transport::CurrentCert;

/// The TTL of a manager's certificate.
pub struct TtlGauge {
    opts: Opts,
    desc: Desc,
    current: Arc<CurrentCert>,
}

impl TtlGauge {
    /// A gauge named `name` reading `current`.
    pub fn new(name: &str, help: &str, current: Arc<CurrentCert>) -> TtlGauge {
        let opts = Opts::new(name, help);
        let desc = Desc::new(
            name.to_string(),
            help.to_string(),
            Vec::new(),
            Default::default(),
        )
        .unwrap_or_else(|_| {
            // Names here are constants known to be valid.
            Desc::new(
                "invalid".into(),
                "invalid".into(),
                Vec::new(),
                Default::default(),
            )
            .expect("constant descriptor")
        });
        TtlGauge {
            opts,
            desc,
            current,
        }
    }
}

impl Collector for TtlGauge {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Ok(g) = Gauge::with_opts(self.opts.clone()) else {
            return Vec::new();
        };
        g.set(self.current.ttl_seconds().unwrap_or(f64::INFINITY));
        g.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificates::pair::{CertPair, tests::self_signed};

    #[test]
    fn ttl_is_read_at_scrape_time() {
        let current = CurrentCert::new();
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(TtlGauge::new(
                "test_ttl_seconds",
                "help",
                current.clone(),
            )))
            .expect("register");
        let value = |r: &prometheus::Registry| r.gather()[0].get_metric()[0].get_gauge().value();
        assert!(value(&registry).is_infinite());
        let (c, k) = self_signed("a", "b", 2);
        current.set(CertPair::from_pem(&c, &k).expect("pair"));
        let v = value(&registry);
        assert!((2.0 * 86400.0 - 120.0..=2.0 * 86400.0).contains(&v), "{v}");
    }
}
