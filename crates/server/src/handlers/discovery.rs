//! `environment/info`, `environment/status` and the discovery methods
//! (`environmentConfig/read`, `capabilities/discoverV2`,
//! `capabilityRoots/discoverV1`).

use super::blocking;
use crate::connection::Ctx;
use crate::discovery;
use exec_server_protocol::methods as m;
use exec_server_protocol::types::*;
use exec_server_rpc::router::{Mode, Reply, Router};

pub(super) fn register(r: &mut Router<Ctx>, fs_mode: Mode) {
    r.request_reply(
        m::ENVIRONMENT_INFO,
        Mode::Inline,
        |ctx: Ctx, _: ()| async move {
            // Encoded once at start: nothing in it changes while the server runs.
            Ok(Reply {
                result_json: ctx.server.env_info_json.clone(),
                after_send: None,
            })
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
        |_: Ctx, p: RootsDiscoverParams| async move {
            blocking(move || discovery::roots_discover_v1(&p)).await
        },
    );
}
