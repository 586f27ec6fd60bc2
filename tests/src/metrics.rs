//! Scrape a node's `/metrics` over plain HTTP/1.1 and read samples from the
//! Prometheus text format, for tests.
//!
//! A sample is found by metric name and a subset of its labels. The parser
//! handles what Wharf writes (quoted label values with `\\`, `\"`, `\n`
//! escapes); it is not a general exposition parser.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bound on a scrape's size; Wharf's output for a test cluster is a few KiB.
const MAX_SCRAPE_BYTES: u64 = 16 << 20;

/// GET http://{addr}/metrics; the body, or an error on a non-200 answer.
pub async fn scrape(addr: &str) -> Result<String> {
    tokio::time::timeout(Duration::from_secs(5), get(addr, "/metrics"))
        .await
        .with_context(|| format!("scrape of {addr} timed out"))?
}

/// GET http://{addr}{path}: (status code, content type, body).
pub async fn get_raw(addr: &str, path: &str) -> Result<(u16, String, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.take(MAX_SCRAPE_BYTES).read_to_end(&mut raw).await?;
    let text = String::from_utf8(raw).context("response is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("response without a header end")?;
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .context("bad status line")?;
    let content_type = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    Ok((status, content_type, body.to_string()))
}

async fn get(addr: &str, path: &str) -> Result<String> {
    let (status, _, body) = get_raw(addr, path).await?;
    if status != 200 {
        bail!("GET {path} on {addr}: HTTP {status}: {body}");
    }
    Ok(body)
}

/// One parsed sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of a text exposition (comments skipped).
pub fn parse(text: &str) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        out.push(parse_line(line).with_context(|| format!("bad sample line {line:?}"))?);
    }
    Ok(out)
}

fn parse_line(line: &str) -> Result<Sample> {
    let (series, value) = line.rsplit_once(' ').context("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse()?,
    };
    let Some((name, rest)) = series.split_once('{') else {
        return Ok(Sample {
            name: series.to_string(),
            labels: BTreeMap::new(),
            value,
        });
    };
    let body = rest.strip_suffix('}').context("unclosed labels")?;
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            bail!("label {key} without a quoted value");
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => bail!("dangling escape"),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key, value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Samples named `name` whose labels include every pair of `labels`.
pub fn find<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// The value of the one sample `name{labels}`; None if there is none or more than one.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    match find(samples, name, labels).as_slice() {
        [one] => Some(one.value),
        _ => None,
    }
}

/// How many calls of gRPC method `method` the node with metrics at `addr`
/// answered OK (a streaming call counts when it ends); 0 before the first.
pub async fn grpc_ok_calls(addr: &str, method: &str) -> Result<f64> {
    let samples = parse(&scrape(addr).await?)?;
    Ok(value(
        &samples,
        "wharf_grpc_server_handled_total",
        &[("grpc_method", method), ("grpc_code", "OK")],
    )
    .unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labels_with_escapes() {
        let s = parse("# HELP x y\nx{a=\"1\",b=\"q\\\"u\\\\o\\nte\"} 2.5\ny 3\n").unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].labels["b"], "q\"u\\o\nte");
        assert_eq!(value(&s, "x", &[("a", "1")]), Some(2.5));
        assert_eq!(value(&s, "y", &[]), Some(3.0));
        assert_eq!(value(&s, "x", &[("a", "2")]), None);
    }
}
