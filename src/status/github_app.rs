//! GitHub App authentication for the forge clients (commit statuses, `--open-pr`): instead of a
//! person's long-lived token, an installation access token minted from the app's private key, as
//! GitHub documents it and Flux offers.
//!
//! 1. A JWT signed RS256 with the app's private key (the PEM file GitHub hands out), `iss` the app
//!    id, issued 60 s in the past (GitHub's advice against clock drift) and valid 9 minutes
//!    (GitHub's limit is 10).
//! 2. Without a configured installation id, `GET {api}/repos/{owner}/{repo}/installation` with the
//!    JWT finds the app's installation on the fleet repo.
//! 3. `POST {api}/app/installations/{id}/access_tokens` with the JWT returns the token (valid one
//!    hour) and its `expires_at`.
//!
//! Tokens are kept per process and reused until [`REFRESH_MARGIN`] before they expire, so a pass
//! never sends a token that dies in flight and an agent mints about one an hour. The key file is
//! read at every mint: a rotated Secret is picked up by the next token.

use super::forge::{ForgeError, api_client, error_message, github_headers};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

/// A token is minted again when less than this is left of it.
pub const REFRESH_MARGIN: chrono::TimeDelta = chrono::TimeDelta::minutes(5);
/// How far in the past a JWT says it was issued (clock drift between us and GitHub).
const JWT_BACKDATE: chrono::TimeDelta = chrono::TimeDelta::seconds(60);
/// How long a JWT is valid from now (GitHub refuses more than 10 minutes).
const JWT_LIFETIME: chrono::TimeDelta = chrono::TimeDelta::minutes(9);

/// A GitHub App that acts for fleetgate: the caller's configuration (`--forge-app-id`,
/// `--forge-app-installation-id`, `--forge-app-key-file`), never the fleet repo's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GithubApp {
    pub app_id: u64,
    /// `None`: looked up from the repository.
    pub installation_id: Option<u64>,
    pub private_key_file: PathBuf,
}

/// A minted token, with what it was minted for.
#[derive(Clone)]
struct Minted {
    token: String,
    expires_at: DateTime<Utc>,
}

type CacheKey = (String, String, GithubApp);

static MINTED: LazyLock<Mutex<HashMap<CacheKey, Minted>>> = LazyLock::new(Mutex::default);

/// An installation token for `repository` on the GitHub API at `api`: the one kept from an earlier
/// call while more than [`REFRESH_MARGIN`] of it is left, else a new one.
///
/// # Errors
/// [`ForgeError::AppKey`] (the key file), [`ForgeError::AppRejected`] (GitHub refused the JWT),
/// [`ForgeError::AppNotInstalled`], else the forge's transport and unexpected-answer errors.
pub async fn installation_token(api: &str, repository: &str, app: &GithubApp) -> Result<String, ForgeError> {
    let key = (api.to_string(), repository.to_string(), app.clone());
    if let Some(m) = MINTED.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        if m.expires_at - Utc::now() > REFRESH_MARGIN {
            return Ok(m.token.clone());
        }
    }
    let minted = mint(api, repository, app).await?;
    let token = minted.token.clone();
    MINTED.lock().unwrap_or_else(|p| p.into_inner()).insert(key, minted);
    Ok(token)
}

async fn mint(api: &str, repository: &str, app: &GithubApp) -> Result<Minted, ForgeError> {
    let jwt = app_jwt(app, Utc::now())?;
    let client = api_client("GitHub", api)?;
    let installation = match app.installation_id {
        Some(id) => id,
        None => {
            let url = format!("{api}/repos/{repository}/installation");
            let found = call(client.get(&url), &url, &jwt, app, repository).await?;
            found.get("id").and_then(Value::as_u64).ok_or_else(|| unexpected(&url, 200, "no installation id"))?
        }
    };
    let url = format!("{api}/app/installations/{installation}/access_tokens");
    let answer = call(client.post(&url).json(&json!({})), &url, &jwt, app, repository).await?;
    let token = answer.get("token").and_then(Value::as_str).filter(|t| !t.is_empty());
    let expires_at = answer.get("expires_at").and_then(Value::as_str).and_then(|t| t.parse::<DateTime<Utc>>().ok());
    match (token, expires_at) {
        (Some(token), Some(expires_at)) => Ok(Minted { token: token.to_string(), expires_at }),
        _ => Err(unexpected(&url, 201, "no token and expires_at in the answer")),
    }
}

/// Sends one app-authenticated request and returns its JSON answer.
async fn call(
    req: reqwest::RequestBuilder,
    url: &str,
    jwt: &str,
    app: &GithubApp,
    repository: &str,
) -> Result<Value, ForgeError> {
    let mut req = req.bearer_auth(jwt);
    for (name, value) in github_headers() {
        req = req.header(name, value);
    }
    let transport = |source: reqwest::Error| ForgeError::Transport {
        forge: "GitHub",
        url: url.to_string(),
        source: source.without_url(),
    };
    let response = req.send().await.map_err(transport)?;
    let code = response.status().as_u16();
    let text = response.text().await.map_err(transport)?;
    match code {
        200..=299 => serde_json::from_str(&text).map_err(|_| unexpected(url, code, "an answer that is not JSON")),
        401 => Err(ForgeError::AppRejected { app_id: app.app_id, message: error_message(&text) }),
        404 => Err(ForgeError::AppNotInstalled {
            app_id: app.app_id,
            installation: app.installation_id,
            repository: repository.to_string(),
            message: error_message(&text),
        }),
        other => Err(ForgeError::Unexpected { forge: "GitHub", status: other, message: error_message(&text) }),
    }
}

fn unexpected(url: &str, status: u16, what: &str) -> ForgeError {
    ForgeError::Unexpected { forge: "GitHub", status, message: format!("{url} answered with {what}") }
}

/// The app's JWT at `now`: `header.claims.signature`, each base64url without padding.
///
/// # Errors
/// [`ForgeError::AppKey`] when the key file cannot be read or is not an RSA private key in PEM.
pub fn app_jwt(app: &GithubApp, now: DateTime<Utc>) -> Result<String, ForgeError> {
    let key = read_key(&app.private_key_file)?;
    let header = json!({"alg": "RS256", "typ": "JWT"});
    let claims = json!({
        "iat": (now - JWT_BACKDATE).timestamp(),
        "exp": (now + JWT_LIFETIME).timestamp(),
        "iss": app.app_id.to_string(),
    });
    let signing_input =
        format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()));
    let key_error = |e: openssl::error::ErrorStack| ForgeError::AppKey {
        file: app.private_key_file.clone(),
        reason: format!("signing failed: {e}"),
    };
    let mut signer = openssl::sign::Signer::new(openssl::hash::MessageDigest::sha256(), &key).map_err(key_error)?;
    signer.update(signing_input.as_bytes()).map_err(key_error)?;
    let signature = signer.sign_to_vec().map_err(key_error)?;
    Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

fn read_key(path: &Path) -> Result<openssl::pkey::PKey<openssl::pkey::Private>, ForgeError> {
    let bad = |reason: String| ForgeError::AppKey { file: path.to_path_buf(), reason };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let key = openssl::pkey::PKey::private_key_from_pem(&pem)
        .map_err(|_| bad("not a PEM private key (give the .pem file GitHub generated for the app)".into()))?;
    if key.rsa().is_err() {
        return Err(bad("not an RSA key (GitHub App keys are RSA)".into()));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app_with_key(dir: &Path) -> (GithubApp, openssl::pkey::PKey<openssl::pkey::Private>) {
        let rsa = openssl::rsa::Rsa::generate(2048).unwrap();
        let key = openssl::pkey::PKey::from_rsa(rsa).unwrap();
        let file = dir.join("app.pem");
        std::fs::write(&file, key.private_key_to_pem_pkcs8().unwrap()).unwrap();
        (GithubApp { app_id: 4242, installation_id: None, private_key_file: file }, key)
    }

    #[test]
    fn the_jwt_is_rs256_signed_by_the_app_key_with_githubs_claims() {
        let dir = tempfile::tempdir().unwrap();
        let (app, key) = app_with_key(dir.path());
        let now: DateTime<Utc> = "2026-12-03T10:00:00Z".parse().unwrap();
        let jwt = app_jwt(&app, now).unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let decode = |p: &str| -> Value { serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).unwrap()).unwrap() };
        assert_eq!(decode(parts[0]), json!({"alg": "RS256", "typ": "JWT"}));
        let claims = decode(parts[1]);
        assert_eq!(claims, json!({"iat": now.timestamp() - 60, "exp": now.timestamp() + 540, "iss": "4242"}));
        let mut verifier = openssl::sign::Verifier::new(openssl::hash::MessageDigest::sha256(), &key).unwrap();
        verifier.update(format!("{}.{}", parts[0], parts[1]).as_bytes()).unwrap();
        assert!(verifier.verify(&URL_SAFE_NO_PAD.decode(parts[2]).unwrap()).unwrap());
    }

    #[test]
    fn a_key_that_is_missing_not_pem_or_not_rsa_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (mut app, _) = app_with_key(dir.path());
        let now = Utc::now();
        std::fs::write(&app.private_key_file, "ghp_this_is_a_token\n").unwrap();
        let e = app_jwt(&app, now).unwrap_err().to_string();
        assert!(e.contains("app.pem") && e.contains("not a PEM private key"), "{e}");
        let ec = openssl::ec::EcKey::generate(
            &openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap(),
        )
        .unwrap();
        std::fs::write(&app.private_key_file, ec.private_key_to_pem().unwrap()).unwrap();
        let e = app_jwt(&app, now).unwrap_err().to_string();
        assert!(e.contains("not an RSA key"), "{e}");
        app.private_key_file = dir.path().join("gone.pem");
        let e = app_jwt(&app, now).unwrap_err().to_string();
        assert!(e.contains("gone.pem"), "{e}");
    }
}
