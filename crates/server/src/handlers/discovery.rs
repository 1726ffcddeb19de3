//! `environment/info`, `environment/status` and the discovery methods
//! (`environmentConfig/read`, `capabilities/discoverV2`,
//! `capabilityRoots/discoverV1`).

use super::blocking;
use crate::connection::Ctx;
use crate::discovery;
use crate::sandbox::fs_helper::{self, Need, Route};
use exec_server_protocol::methods as m;
use exec_server_protocol::types::*;
use exec_server_rpc::router::{Mode, Reply, Router};

pub(super) fn register(r: &mut Router<Ctx>, fs_mode: Mode) {
    r.request_reply(
        m::ENVIRONMENT_INFO,
        Mode::Inline,
        |ctx: Ctx, _: ()| async move {
            // Encoded once at start: nothing in it changes while the server runs.
            Ok(Reply::json(ctx.server.env_info_json.clone()))
        },
    );
    r.request(
        m::ENVIRONMENT_STATUS,
        Mode::Inline,
        |_: Ctx, _: ()| async move {
            Ok(StatusResponse {
                status: "ready".into(),
            })
        },
    );
    r.request(
        m::ENVIRONMENT_CONFIG_READ,
        fs_mode,
        |_: Ctx, p: EnvironmentConfigReadParams| async move {
            blocking(move || discovery::environment_config_read(&p)).await
        },
    );
    r.request(
        m::CAPABILITIES_DISCOVER_V2,
        fs_mode,
        |_: Ctx, p: DiscoverV2Params| async move {
            blocking(move || discovery::discover_v2(&p)).await
        },
    );
    r.request(
        m::CAPABILITY_ROOTS_DISCOVER_V1,
        fs_mode,
        |ctx: Ctx, p: RootsDiscoverParams| async move {
            // Each root is scanned under its own sandbox: in the confined
            // helper when the sandbox restricts reads, so a denied directory
            // is never read (its errors become warnings, as the reference's).
            let mut roots = Vec::with_capacity(p.roots.len());
            for root in p.roots {
                // The scan reads files below the root through whatever
                // links it meets (one may lead into a directory a sandbox
                // wrote): no path checked up front covers them, so under a
                // sandbox it always runs in the helper's view.
                let route =
                    fs_helper::route(root.sandbox.as_ref(), Need::Read, None, &ctx.server.sandbox)?
                        .refusing_symlinks(false);
                let one = RootsDiscoverParams {
                    roots: vec![CapabilityRoot {
                        sandbox: None,
                        ..root
                    }],
                };
                let mut found: RootsDiscoverResponse = match route {
                    Route::Helper(h) => h.call(m::CAPABILITY_ROOTS_DISCOVER_V1, &one).await?,
                    Route::InProcess => {
                        blocking(move || discovery::roots_discover_v1(&one)).await?
                    }
                };
                roots.append(&mut found.roots);
            }
            Ok(RootsDiscoverResponse { roots })
        },
    );
}
