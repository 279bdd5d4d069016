// Command interop calls keyward as the clients of the systems it serves call their control
// planes: each mode sets up grpc-go, crypto/tls and net/http the way its upstream code does
// (the file and commit are named at each mode), so that tests/interop.rs proves keyward against
// the libraries those systems use, not only against clients written beside it.
//
// Built in GOPATH mode from Debian's packages (golang-go, golang-google-grpc-dev,
// golang-google-protobuf-dev): grpc-go 1.33, where upstream has newer releases. Where 1.33
// differs, the code says so: grpc.Dial stands for grpc.NewClient (which 1.33 lacks; both build
// the same TLS configuration and :authority from the target), grpc.WithInsecure for
// insecure.NewCredentials.
//
// The target names a Service of the cluster (`lm-eval-grpc.lm-eval.svc:8082`); -connect says
// where the test listens, and the dialer goes there, as the cluster's DNS would. Nothing else
// of the client changes.
//
// Each run prints one JSON line: the outcome as the caller saw it.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"keyward.test/pb/kfpv1"
	"keyward.test/pb/kfpv2"
	"keyward.test/pb/lmeval"
)

// result is what the caller saw.
type result struct {
	OK bool `json:"ok"`
	// Code and Message: a gRPC call's status (Code "OK" when it succeeded).
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	// ALPN: the protocol the TLS handshake settled on ("" over plain text).
	ALPN string `json:"alpn,omitempty"`
	// Status, Proto, Body: an HTTP exchange.
	Status int    `json:"status,omitempty"`
	Proto  string `json:"proto,omitempty"`
	Body   string `json:"body,omitempty"`
	// Error: the call could not be made at all (a refused handshake, say).
	Error string `json:"error,omitempty"`
}

var (
	mode       = flag.String("mode", "", "fms-driver | kfp-persistence-agent | kfp-scheduled-workflow | kfp-cache | http | webhook | evalhub-sidecar")
	connect    = flag.String("connect", "", "host:port the test listens on; every connection goes there")
	target     = flag.String("target", "", "the address the client is configured with (a Service's name and port)")
	caFile     = flag.String("ca", "", "the CA file the client is given (GRPC_SERVER_CA, --caCertPath, a caBundle)")
	certFile   = flag.String("cert", "", "a client certificate (GRPC_CLIENT_CERT)")
	keyFile    = flag.String("key", "", "its key (GRPC_CLIENT_KEY)")
	tlsOn      = flag.Bool("tls", false, "KFP: --mlPipelineServiceTLSEnabled (or the cache client's --metadata_tls_enabled)")
	tokenFile  = flag.String("token-file", "", "KFP: the projected service-account token file")
	userHeader = flag.String("user-identity-header", "", "KFP scheduled workflow: --userIdentityHeader")
	userValue  = flag.String("user-identity-value", "", "KFP scheduled workflow: --userIdentityValue")
	jobName    = flag.String("job-name", "", "LMEvalJob driver: --job-name")
	jobNS      = flag.String("job-namespace", "", "LMEvalJob driver: --job-namespace")
	method     = flag.String("method", "", "kfp-cache: ListTasksV1 | CreateTaskV1; kfp-persistence-agent: ReportWorkflowV1 | ReportRunMetricsV1")
	url        = flag.String("url", "", "http, webhook: the URL")
	http1Only  = flag.Bool("http1", false, "http: HTTP/1.1 only (an empty TLSNextProto, as a program that turns HTTP/2 off does)")
	bodyFile   = flag.String("body", "", "webhook: the AdmissionReview to send; evalhub-sidecar: the event")
	path       = flag.String("path", "", "evalhub-sidecar: the path the adapter posts to")
	tenant     = flag.String("tenant", "", "evalhub-sidecar: the adapter's X-Tenant")
	xUser      = flag.String("x-user", "", "evalhub-sidecar: an X-User the adapter adds (none by default)")
)

func main() {
	flag.Parse()
	var out result
	switch *mode {
	case "fms-driver":
		out = fmsDriver()
	case "kfp-persistence-agent":
		out = kfpPersistenceAgent()
	case "kfp-scheduled-workflow":
		out = kfpScheduledWorkflow()
	case "kfp-cache":
		out = kfpCache()
	case "http":
		out = httpGet()
	case "webhook":
		out = webhook()
	case "evalhub-sidecar":
		out = evalhubSidecar()
	default:
		fmt.Fprintf(os.Stderr, "unknown -mode %q\n", *mode)
		os.Exit(2)
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}

// dialer sends every connection to -connect, as the cluster's DNS would send the Service's.
func dialer(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", *connect)
}

// grpcOutcome is a finished call as the caller saw it.
func grpcOutcome(err error, p *peer.Peer) result {
	out := result{OK: err == nil, Code: status.Code(err).String()}
	if err != nil {
		out.Message = status.Convert(err).Message()
	}
	if p != nil {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			out.ALPN = info.State.NegotiatedProtocol
		}
	}
	return out
}

// fmsDriver: foundation-model-stack/fms-lm-eval-service 38689a3, backend/driver/driver.go
// l.137-185 (the connection) and l.231-241 (the first call). GRPC_SERVER_CA with
// GRPC_CLIENT_CERT and GRPC_CLIENT_KEY: mutual TLS, tls.Config{ServerName: serverAddr,
// Certificates, RootCAs}; GRPC_SERVER_CA alone: credentials.NewClientTLSFromFile(ca,
// serverAddr). serverAddr is "<service>.<namespace>.svc:<port>", port included, and is both the
// target and the ServerName.
func fmsDriver() result {
	serverAddr := *target
	var creds credentials.TransportCredentials
	if *certFile != "" && *keyFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return result{Error: err.Error()}
		}
		ca := x509.NewCertPool()
		caBytes, err := os.ReadFile(*caFile)
		if err != nil {
			return result{Error: err.Error()}
		}
		if ok := ca.AppendCertsFromPEM(caBytes); !ok {
			return result{Error: "no CA certificate in " + *caFile}
		}
		tlsConfig := &tls.Config{
			ServerName:   serverAddr,
			Certificates: []tls.Certificate{cert},
			RootCAs:      ca,
		}
		creds = credentials.NewTLS(tlsConfig)
	} else {
		var err error
		creds, err = credentials.NewClientTLSFromFile(*caFile, serverAddr)
		if err != nil {
			return result{Error: err.Error()}
		}
	}
	conn, err := grpc.Dial(serverAddr, grpc.WithTransportCredentials(creds), grpc.WithContextDialer(dialer))
	if err != nil {
		return result{Error: err.Error()}
	}
	defer conn.Close()
	client := lmeval.NewLMEvalJobUpdateServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second*10)
	defer cancel()
	var p peer.Peer
	_, err = client.UpdateStatus(ctx, &lmeval.JobStatus{
		JobName:       *jobName,
		JobNamespace:  *jobNS,
		State:         "Running",
		Reason:        "NoReason",
		StatusMessage: "update status from the driver: running",
	}, grpc.Peer(&p))
	return grpcOutcome(err, &p)
}

// kfpTransport: kubeflow/pipelines 7b70c7b, backend/src/common/util/tls_config.go l.26-45
// (GetTLSConfig: the system pool plus caCertPath, nothing else; an empty path is plain text)
// and service.go l.107-156 (grpc.NewClient(address, WithTransportCredentials(creds)) and no
// other option).
func kfpTransport() grpc.DialOption {
	if !*tlsOn || *caFile == "" {
		return grpc.WithInsecure()
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	caCert, err := os.ReadFile(*caFile)
	if err == nil {
		pool.AppendCertsFromPEM(caCert)
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool}))
}

func kfpDial() (*grpc.ClientConn, error) {
	return grpc.Dial(*target, kfpTransport(), grpc.WithContextDialer(dialer))
}

// kfpToken reads the projected token file whole, as the agents do.
func kfpToken() string {
	if *tokenFile == "" {
		return ""
	}
	b, err := os.ReadFile(*tokenFile)
	if err != nil {
		return ""
	}
	return string(b)
}

// kfpPersistenceAgent: kubeflow/pipelines 7b70c7b, backend/src/agent/persistence/client/
// pipeline_client.go l.82-111 and l.200-207: target "ml-pipeline:8887", metadata
// "Authorization: Bearer <token>" (tokenrefresher/token_refresher.go: the whole file), a
// one-minute deadline; ReportWorkflowV1 {1: the workflow as JSON}, ReportRunMetricsV1 {1:
// run_id, 2: metrics}.
func kfpPersistenceAgent() result {
	conn, err := kfpDial()
	if err != nil {
		return result{Error: err.Error()}
	}
	defer conn.Close()
	pctx := metadata.AppendToOutgoingContext(context.Background(), "Authorization", "Bearer "+kfpToken())
	ctx, cancel := context.WithTimeout(pctx, time.Minute)
	defer cancel()
	var p peer.Peer
	switch *method {
	case "ReportRunMetricsV1":
		_, err = kfpv1.NewRunServiceClient(conn).ReportRunMetricsV1(ctx, &kfpv1.ReportRunMetricsRequest{
			RunId:   "run-1",
			Metrics: []*kfpv1.RunMetric{{Name: "accuracy", NodeId: "node-1", Value: &kfpv1.RunMetric_NumberValue{NumberValue: 0.9}}},
		}, grpc.Peer(&p))
	default:
		_, err = kfpv1.NewReportServiceClient(conn).ReportWorkflowV1(ctx, &kfpv1.ReportWorkflowRequest{
			Workflow: `{"kind":"Workflow","metadata":{"name":"run-1","namespace":"team-a"}}`,
		}, grpc.Peer(&p))
	}
	return grpcOutcome(err, &p)
}

// kfpScheduledWorkflow: kubeflow/pipelines 7b70c7b, backend/src/crd/controller/
// scheduledworkflow/main.go l.119-139 (target "ml-pipeline:8887"; the token file if it exists)
// and controller.go l.646-707: "Authorization: Bearer <token>" and, in a multi-user install,
// --userIdentityHeader: --userIdentityValue (kubeflow-userid:
// system:serviceaccount:kubeflow:ml-pipeline-scheduledworkflow); CreateRun {1: experiment_id,
// 2: Run}.
func kfpScheduledWorkflow() result {
	conn, err := kfpDial()
	if err != nil {
		return result{Error: err.Error()}
	}
	defer conn.Close()
	ctx := context.Background()
	if token := kfpToken(); token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "Authorization", "Bearer "+token)
	}
	if *userHeader != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, *userHeader, *userValue)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var p peer.Peer
	_, err = kfpv2.NewRunServiceClient(conn).CreateRun(ctx, &kfpv2.CreateRunRequest{
		ExperimentId: "experiment-1",
		Run:          &kfpv2.Run{ExperimentId: "experiment-1", DisplayName: "nightly"},
	}, grpc.Peer(&p))
	return grpcOutcome(err, &p)
}

// kfpCache: kubeflow/pipelines 7b70c7b, backend/src/v2/cacheutils/cache.go l.79-147: target
// "ml-pipeline.kubeflow.svc.cluster.local:8887", TLS only with --metadata_tls_enabled and a CA
// path, MaxCallRecvMsgSize 100 MiB, and no metadata at all; ListTasksV1 {2: page_size, 3:
// sort_by, 5: filter}, CreateTaskV1 {1: Task}.
func kfpCache() result {
	conn, err := grpc.Dial(*target, kfpTransport(), grpc.WithContextDialer(dialer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(100*1024*1024)))
	if err != nil {
		return result{Error: err.Error()}
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := kfpv1.NewTaskServiceClient(conn)
	var p peer.Peer
	switch *method {
	case "CreateTaskV1":
		_, err = client.CreateTaskV1(ctx, &kfpv1.CreateTaskRequest{Task: &kfpv1.Task{
			Namespace: "team-a", PipelineName: "pipeline/p", RunId: "run-1", MlmdExecutionID: "7", Fingerprint: "f00d",
		}}, grpc.Peer(&p))
	default:
		_, err = client.ListTasksV1(ctx, &kfpv1.ListTasksRequest{
			PageSize: 1, SortBy: "created_at desc", Filter: `{"predicates":[{"key":"fingerprint","op":"EQUALS","string_value":"f00d"}]}`,
		}, grpc.Peer(&p))
	}
	return grpcOutcome(err, &p)
}

// tlsClientConfig: the CA given, and the client certificate if one is.
func tlsClientConfig() (*tls.Config, error) {
	pool := x509.NewCertPool()
	caBytes, err := os.ReadFile(*caFile)
	if err != nil {
		return nil, err
	}
	pool.AppendCertsFromPEM(caBytes)
	config := &tls.Config{RootCAs: pool}
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return nil, err
		}
		config.Certificates = []tls.Certificate{cert}
	}
	return config, nil
}

// httpGet: Go's net/http client with its defaults: a Transport given a TLS configuration and
// ForceAttemptHTTP2 negotiates h2 over TLS, as http.DefaultTransport does; with -http1, an empty
// TLSNextProto turns HTTP/2 off, as a program that disables it does.
func httpGet() result {
	config, err := tlsClientConfig()
	if err != nil {
		return result{Error: err.Error()}
	}
	transport := &http.Transport{
		TLSClientConfig:   config,
		ForceAttemptHTTP2: true,
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dialer(ctx, "") },
	}
	if *http1Only {
		transport.ForceAttemptHTTP2 = false
		transport.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	client := &http.Client{Transport: transport, Timeout: time.Minute}
	resp, err := client.Get(*url)
	if err != nil {
		return result{Error: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := result{OK: resp.StatusCode == 200, Status: resp.StatusCode, Proto: resp.Proto, Body: string(body)}
	if resp.TLS != nil {
		out.ALPN = resp.TLS.NegotiatedProtocol
	}
	return out
}

// webhook: the kube-apiserver's client of a Service-referenced admission webhook
// (kubernetes/apiserver 24a394e5, pkg/util/webhook/client.go and authentication.go; client-go
// 32ce75a7, rest and transport): tls.Config{ServerName: "<service>.<namespace>.svc", RootCAs:
// the caBundle, NextProtos: ["http/1.1"] (HTTP/2 is off for Service webhooks since 1.16),
// MinVersion: TLS 1.2}; POST <path>?timeout=10s with Content-Type application/json, Accept
// "application/json, */*" and User-Agent kube-apiserver-admission.
func webhook() result {
	pool := x509.NewCertPool()
	caBytes, err := os.ReadFile(*caFile)
	if err != nil {
		return result{Error: err.Error()}
	}
	pool.AppendCertsFromPEM(caBytes)
	config := &tls.Config{
		ServerName: *target,
		RootCAs:    pool,
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	}
	transport := &http.Transport{
		TLSClientConfig:     config,
		TLSHandshakeTimeout: 10 * time.Second,
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dialer(ctx, "") },
	}
	review, err := os.ReadFile(*bodyFile)
	if err != nil {
		return result{Error: err.Error()}
	}
	req, err := http.NewRequest("POST", *url, bytes.NewReader(review))
	if err != nil {
		return result{Error: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, */*")
	req.Header.Set("User-Agent", "kube-apiserver-admission")
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return result{Error: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := result{OK: resp.StatusCode == 200, Status: resp.StatusCode, Proto: resp.Proto, Body: string(body)}
	if resp.TLS != nil {
		out.ALPN = resp.TLS.NegotiatedProtocol
	}
	return out
}

// clientRoundTripper sends through an *http.Client, as eval-hub's roundTripperFromClient does.
type clientRoundTripper struct{ client *http.Client }

func (c clientRoundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return c.client.Do(r) }

// evalhubSidecar: an evaluation pod of TrustyAI EvalHub (eval-hub/eval-hub ba127125): the
// adapter posts an event to the sidecar on localhost, and the sidecar's reverse proxy sends it on
// to eval_hub.base_url (internal/eval_runtime_sidecar: handlers/evalhub.go, proxy/proxy.go
// NewReverseProxy, proxy/http_client.go buildTLSConfig and newHTTPClient): a Transport whose
// TLSClientConfig is {MinVersion: TLS 1.2, MaxVersion: TLS 1.3, RootCAs: the service CA alone}
// (so HTTP/1.1: a custom TLS configuration turns HTTP/2 off), a 30 s client timeout, the
// projected token read from its file and set as `Authorization: Bearer`, X-Global-Transaction-Id
// set, and the adapter's other headers (X-Tenant, Content-Type, and whatever else it adds)
// passed on. Go 1.19 has no ReverseProxy.Rewrite: the Director here does what eval-hub's Rewrite
// does (SetURL, the outgoing Host the target's), and adds the X-Forwarded-For a Director proxy
// adds, which the gate drops.
func evalhubSidecar() result {
	pem, err := os.ReadFile(*caFile)
	if err != nil {
		return result{Error: err.Error()}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return result{Error: "the CA file holds no PEM certificate"}
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS13, RootCAs: pool}
	transport := &http.Transport{
		TLSClientConfig: tlsConfig,
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return dialer(ctx, "") },
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: transport}
	target, err := neturl.Parse(strings.TrimSuffix(*url, "/"))
	if err != nil {
		return result{Error: err.Error()}
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	direct := proxy.Director
	proxy.Director = func(r *http.Request) {
		direct(r)
		r.Host = ""
		r.RequestURI = "" // as eval-hub's Rewrite: required for client requests
		r.Header.Set("X-Global-Transaction-Id", "txn-1")
		token, err := os.ReadFile(*tokenFile)
		if err == nil && len(token) > 0 {
			r.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		}
	}
	proxy.Transport = clientRoundTripper{client}
	// As eval-hub's proxyErrorHandler: a 502; the error is kept for the outcome.
	var proxyErr string
	proxy.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
		proxyErr = err.Error()
		w.WriteHeader(http.StatusBadGateway)
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{Error: err.Error()}
	}
	go http.Serve(listener, proxy)
	event, err := os.ReadFile(*bodyFile)
	if err != nil {
		return result{Error: err.Error()}
	}
	req, err := http.NewRequest("POST", "http://"+listener.Addr().String()+*path, bytes.NewReader(event))
	if err != nil {
		return result{Error: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", *tenant)
	if *xUser != "" {
		req.Header.Set("X-User", *xUser)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{Error: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return result{OK: resp.StatusCode < 300, Status: resp.StatusCode, Proto: resp.Proto, Body: string(body), Error: proxyErr}
}
