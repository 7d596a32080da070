//! `GET /v1/regions`: where sandboxes and volumes can be placed, from configuration.

use crate::auth::Principal;
use crate::openapi::Unauthenticated;
use crate::state::ServerState;
use axum::extract::State;
use axum::Json;
use lizard_api::Region;

/// The regions this control plane places sandboxes in.
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_REGIONS.path,
    tag = "regions",
    security(("apiKey" = [])),
    responses((status = 200, description = "Regions", body = Vec<Region>), Unauthenticated)
)]
pub async fn list(State(state): State<ServerState>, _p: Principal) -> Json<Vec<Region>> {
    Json(state.config.effective_regions())
}
