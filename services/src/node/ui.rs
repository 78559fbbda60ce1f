//! The operator's console: a web dashboard at `/ui` on the admin address.
//!
//! Its files are embedded in the binary (`ui/`): a page, its script and
//! style, and uPlot for the charts (vendored from npm, see
//! `ui/vendor/README.md`). Nothing is fetched from another origin and
//! nothing is built at run time. The page reads the admin API it is
//! served beside, so it shows what an operator could read there:
//!
//! - pools and their clusters (size, state, running and queued queries,
//!   bill, health), a shadow-mode pool's comparison, and the fleet when
//!   there are several nodes;
//! - live charts sampled in the browser: VR over a sliding window against
//!   τ, latency percentiles, cost per (virtual) hour, offloaded share;
//! - the decision log, filtered by pool, tenant and kind (routing with
//!   its explanation and runner-up, scaling with every candidate's
//!   simulated VR and cost, tuner runs with their plans).
//!
//! The page is public, like the files of any web console; what it reads
//! and changes is not. Reads follow `node.reads_require_token`, and the
//! mutations (add or remove a cluster, tune now) need the admin token,
//! which the operator enters once per browser session: the page keeps it
//! in `sessionStorage` and sends it as a bearer header, never in a URL.
//! Every response carries a content security policy that allows scripts,
//! styles and requests from this origin only.

use actix_web::HttpResponse;

/// `GET /ui`: the page.
pub async fn page() -> HttpResponse {
    served("text/html; charset=utf-8", include_str!("ui/index.html"))
}

/// `GET /ui/app.js`.
pub async fn script() -> HttpResponse {
    served("text/javascript; charset=utf-8", include_str!("ui/app.js"))
}

/// `GET /ui/style.css`.
pub async fn style() -> HttpResponse {
    served("text/css; charset=utf-8", include_str!("ui/style.css"))
}

/// `GET /ui/uPlot.iife.min.js`: the vendored chart library.
pub async fn chart_script() -> HttpResponse {
    served("text/javascript; charset=utf-8", include_str!("ui/vendor/uPlot.iife.min.js"))
}

/// `GET /ui/uPlot.min.css`.
pub async fn chart_style() -> HttpResponse {
    served("text/css; charset=utf-8", include_str!("ui/vendor/uPlot.min.css"))
}

/// What every file of the console is served with.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn served(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("Content-Security-Policy", CONTENT_SECURITY_POLICY))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .insert_header(("Referrer-Policy", "no-referrer"))
        .insert_header(("Cache-Control", "no-cache"))
        .body(body)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_loads_only_its_own_files() {
        let page = include_str!("ui/index.html");
        for needed in ["/ui/app.js", "/ui/style.css", "/ui/uPlot.iife.min.js", "/ui/uPlot.min.css"] {
            assert!(page.contains(needed), "the page loads {needed}");
        }
        for external in ["http://", "https://", "//cdn"] {
            assert!(!page.contains(external), "the page names no other origin ({external})");
        }
        assert!(!page.contains("<script>") && !page.contains("style="), "no inline script or style: the policy forbids them");
        let script = include_str!("ui/app.js");
        assert!(!script.contains("http://") && !script.contains("https://"), "the script reads this origin only");
        assert!(!script.contains("localStorage") && script.contains("sessionStorage"), "the token lives for the session only");
    }
}
