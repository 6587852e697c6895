//! Delivery: the notices that are due, taken from the outbox under a lease, sent, and
//! settled sent or failed (tried again after `retry_after`, doubling to `retry_max`). A
//! notice is sent only while its lease still covers the whole send, so one whose lease may
//! run out first is left for the next pass rather than risk a second notifier sending it too.
//!
//! Mail goes over SMTP with lettre (rustls; STARTTLS or implicit TLS; AUTH when a username is
//! set, its password read from its file for each pass); a webhook is a JSON POST signed with
//! HMAC-SHA256 over the exact body (`X-Autocomp-Signature: sha256=<hex>`) and carrying the
//! notice's key (`X-Autocomp-Key`) for the receiver's deduplication. A 2xx answer is sent;
//! anything else, a redirect or a timeout failed.

use std::path::Path;
use std::time::{Duration, Instant};

use autocomp_store::pipeline_state::MAX_NOTICE_LEASE;
use autocomp_store::{Notice, NoticeOutcome, ObjectStore, StoreError};
use autocomp_toolkit::display_url;
use autocomp_toolkit::tls::ClientTls;
use hmac::{Hmac, KeyInit as _, Mac as _};
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport as _, Message, Tokio1Executor};
use serde_json::Value;
use sha2::Sha256;

use super::config::{MailConfig, NotifyConfig, SmtpSecurity, WebhookConfig};
use super::text;
use crate::operator::OperatorError;

/// Notices taken at a time.
const TAKE: usize = 5;
/// Takes per pass: at most `TAKES * TAKE` deliveries a pass.
const TAKES: usize = 100;
/// The shortest lease taken.
const MIN_LEASE: Duration = Duration::from_secs(120);
/// The webhook's signature and key headers.
pub const SIGNATURE_HEADER: &str = "X-Autocomp-Signature";
pub const KEY_HEADER: &str = "X-Autocomp-Key";

/// How delivery went.
#[derive(Debug, Default)]
pub struct Delivered {
    pub sent: u64,
    pub failed: u64,
    /// One line per failed delivery: `<key>: <why>`.
    pub errors: Vec<String>,
}

/// `sha256=<hex>`: the HMAC-SHA256 of `body` under `key`, as the signature header carries it.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Sends what is due, as `holder`.
pub async fn deliver(store: &dyn ObjectStore, config: &NotifyConfig, holder: &str) -> Result<Delivered, OperatorError> {
    let mut channels = Channels { config, mail: None, webhook: None };
    let budget = channels.send_limit();
    let lease = (budget * TAKE as u32 + Duration::from_secs(60)).clamp(MIN_LEASE, MAX_NOTICE_LEASE);
    let mut delivered = Delivered::default();
    for _ in 0..TAKES {
        let taken_at = Instant::now();
        let taken = store.take_notices(holder, TAKE, lease).await?;
        if taken.is_empty() {
            break;
        }
        for notice in taken {
            // Past this the lease might run out mid-send: leave it for the next pass.
            if taken_at.elapsed() + budget + Duration::from_secs(10) >= lease {
                tracing::debug!(key = notice.key, "left for the next pass: its lease is running out");
                continue;
            }
            let outcome = match tokio::time::timeout(budget, channels.send(&notice)).await {
                Ok(Ok(())) => NoticeOutcome::Sent,
                Ok(Err(error)) => failed(config, &notice, error),
                Err(_) => failed(config, &notice, format!("no answer within {}", humantime::format_duration(budget))),
            };
            let error = match &outcome {
                NoticeOutcome::Failed { error, .. } => Some(error.clone()),
                NoticeOutcome::Sent => None,
            };
            match store.settle_notice(&notice.key, holder, outcome).await {
                Ok(()) => match error {
                    None => delivered.sent += 1,
                    Some(error) => {
                        tracing::warn!(key = notice.key, attempts = notice.attempts + 1, "not delivered: {error}");
                        delivered.failed += 1;
                        delivered.errors.push(format!("{}: {error}", notice.key));
                    }
                },
                // The lease ran out after all and another notifier took it: its to settle.
                Err(StoreError::Conflict(message)) => tracing::warn!(key = notice.key, "{message}"),
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(delivered)
}

fn failed(config: &NotifyConfig, notice: &Notice, error: String) -> NoticeOutcome {
    NoticeOutcome::Failed { error, retry_in: config.retry_in(notice.attempts + 1) }
}

/// The channels' clients, made on first use in a pass (secrets read then).
struct Channels<'a> {
    config: &'a NotifyConfig,
    mail: Option<Result<Mailer, String>>,
    webhook: Option<Result<Webhook, String>>,
}

impl Channels<'_> {
    /// The longest one send may take on any channel.
    fn send_limit(&self) -> Duration {
        let mail = self.config.mail.as_ref().map(|mail| mail.timeout * 2);
        let webhook = self.config.webhook.as_ref().map(|webhook| webhook.timeout + Duration::from_secs(1));
        mail.into_iter().chain(webhook).max().unwrap_or(Duration::from_secs(30))
    }

    async fn send(&mut self, notice: &Notice) -> Result<(), String> {
        match notice.channel.as_str() {
            "mail" => {
                let Some(config) = &self.config.mail else { return Err(unconfigured("mail", self.config)) };
                let mailer = self.mail.get_or_insert_with(|| Mailer::new(config));
                mailer.as_ref().map_err(Clone::clone)?.send(notice).await
            }
            "webhook" => {
                let Some(config) = &self.config.webhook else { return Err(unconfigured("webhook", self.config)) };
                let webhook = self.webhook.get_or_insert_with(|| Webhook::new(config));
                webhook.as_ref().map_err(Clone::clone)?.send(notice).await
            }
            other => Err(format!("no such channel {other:?}")),
        }
    }
}

fn unconfigured(channel: &str, config: &NotifyConfig) -> String {
    format!("{channel} is not configured in {} (any more)", config.file.display())
}

/// A secret from its file: the content with surrounding whitespace removed. Errors name the
/// file, never what it holds.
fn read_secret(path: &Path, key: &str) -> Result<String, String> {
    autocomp_toolkit::file_modes::warn_if_exposed(path, key);
    let text = std::fs::read_to_string(path).map_err(|e| format!("{key} {}: cannot read: {e}", path.display()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(format!("{key} {} is empty", path.display()));
    }
    Ok(secret.to_owned())
}

struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    config: MailConfig,
}

impl Mailer {
    fn new(config: &MailConfig) -> Result<Self, String> {
        let server = &config.server;
        let shown = display_url(&server.url);
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(server.host.as_str())
            .port(server.port)
            .timeout(Some(config.timeout));
        if server.security != SmtpSecurity::Plain {
            let mut tls = TlsParameters::builder(server.host.clone());
            // A private CA, as every other client of the pipeline trusts one.
            if let Some(path) = ClientTls::from_env().ca_file {
                let pem = std::fs::read(&path)
                    .map_err(|e| format!("AUTOCOMP_CA_FILE {}: cannot read: {e}", path.display()))?;
                let certs = Certificate::from_pem(&pem)
                    .map_err(|e| format!("AUTOCOMP_CA_FILE {}: not PEM certificates: {e}", path.display()))?;
                tls = tls.add_root_certificate(certs);
            }
            let tls = tls.build_rustls().map_err(|e| format!("{shown}: TLS: {e}"))?;
            builder = builder.tls(match server.security {
                SmtpSecurity::Tls => Tls::Wrapper(tls),
                _ => Tls::Required(tls),
            });
        }
        if let (Some(username), Some(file)) = (&config.username, &config.password_file) {
            let password = read_secret(file, "notify.mail.password_file")?;
            builder = builder.credentials(Credentials::new(username.clone(), password));
        }
        Ok(Mailer { transport: builder.build(), config: config.clone() })
    }

    async fn send(&self, notice: &Notice) -> Result<(), String> {
        let body = notice.body.get("text").and_then(Value::as_str).unwrap_or_default();
        let body = format!("{body}\n\n-- \nautocomp notify; notice {}\n", notice.key);
        let mut message =
            Message::builder().from(self.config.from.clone()).subject(text::subject(&notice.subject)).message_id(None);
        for to in &self.config.to {
            message = message.to(to.clone());
        }
        let message = message
            .header(ContentType::TEXT_PLAIN)
            .body(body)
            .map_err(|e| format!("the message cannot be made: {e}"))?;
        self.transport
            .send(message)
            .await
            .map(|_| ())
            .map_err(|e| format!("{}: {}", display_url(&self.config.server.url), chain(&e)))
    }
}

struct Webhook {
    client: reqwest::Client,
    url: String,
    secret: String,
    timeout: Duration,
}

impl Webhook {
    fn new(config: &WebhookConfig) -> Result<Self, String> {
        let shown = display_url(&config.url);
        let secret = read_secret(&config.secret_file, "notify.webhook.secret_file")?;
        // Never followed: a redirect would carry the signed body somewhere else.
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.timeout)
            .user_agent(concat!("autocomp-notify/", env!("CARGO_PKG_VERSION")));
        if config.url.starts_with("https://") {
            let tls = ClientTls::from_env().config().map_err(|e| e.to_string())?;
            builder = builder.use_preconfigured_tls(tls);
        }
        let client = builder.build().map_err(|e| format!("{shown}: {}", chain(&e.without_url())))?;
        Ok(Webhook { client, url: config.url.clone(), secret, timeout: config.timeout })
    }

    async fn send(&self, notice: &Notice) -> Result<(), String> {
        let body = serde_json::to_vec(&notice.body).map_err(|e| format!("the body cannot be written: {e}"))?;
        let answer = self
            .client
            .post(&self.url)
            .timeout(self.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature(self.secret.as_bytes(), &body))
            .header(KEY_HEADER, &notice.key)
            .body(body)
            .send()
            .await
            .map_err(|e| format!("{}: {}", display_url(&self.url), chain(&e.without_url())))?;
        let status = answer.status();
        if status.is_success() { Ok(()) } else { Err(format!("{} answered {status}", display_url(&self.url))) }
    }
}

/// An error with its sources, on one line, bounded.
fn chain(error: &dyn std::error::Error) -> String {
    text::one_line(&autocomp_toolkit::error_chain::error_chain(error), 400)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_rfc_4231s_hmac_sha256() {
        // RFC 4231, test case 2.
        let signed = signature(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(signed, "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }
}
