//! A recording HTTP/1.1 proxy on loopback: real clients talk to it, it forwards every request to
//! kiln unchanged and keeps a copy, so a test knows exactly what the client sent.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One recorded request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub status: u16,
}

impl Recorded {
    /// A header value (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The proxy; recording stops when it is dropped.
pub struct Proxy {
    pub port: u16,
    records: Arc<Mutex<Vec<Recorded>>>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream_port`, adding
    /// `extra_headers` (such as `X-Scope-OrgID`) to every forwarded request.
    pub fn start(
        upstream_port: u16,
        extra_headers: Vec<(String, String)>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let records = Arc::new(Mutex::new(Vec::new()));
        let rec = Arc::clone(&records);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let rec = Arc::clone(&rec);
                let extra = extra_headers.clone();
                std::thread::spawn(move || {
                    let _ = serve_connection(stream, upstream_port, &extra, &rec);
                });
            }
        });
        Ok(Self { port, records })
    }

    /// Base URL for clients.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Requests recorded so far.
    pub fn records(&self) -> Vec<Recorded> {
        self.records.lock().expect("records lock").clone()
    }
}

fn serve_connection(
    stream: TcpStream,
    upstream: u16,
    extra: &[(String, String)],
    records: &Mutex<Vec<Recorded>>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(std::io::Error::other)?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body)?;

        let url = format!("http://127.0.0.1:{upstream}{target}");
        let mut req = client.request(method.parse().map_err(std::io::Error::other)?, url);
        for (k, v) in &headers {
            let lower = k.to_ascii_lowercase();
            if ["host", "content-length", "connection", "transfer-encoding"]
                .contains(&lower.as_str())
            {
                continue;
            }
            req = req.header(k, v);
        }
        for (k, v) in extra {
            req = req.header(k, v);
        }
        let (status, resp_body) = match req.body(body.clone()).send() {
            Ok(r) => {
                let s = r.status().as_u16();
                (s, r.bytes().map(|b| b.to_vec()).unwrap_or_default())
            }
            Err(e) => (502, e.to_string().into_bytes()),
        };
        records.lock().expect("records lock").push(Recorded {
            method,
            target,
            headers,
            body,
            status,
        });
        write!(
            writer,
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n",
            resp_body.len()
        )?;
        writer.write_all(&resp_body)?;
        writer.flush()?;
    }
}
