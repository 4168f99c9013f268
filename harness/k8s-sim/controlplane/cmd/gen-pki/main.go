// Command gen-pki makes what a test control plane on loopback needs: a CA, the API
// server's serving certificate, the service-account signing key, client certificates for
// an administrator (group system:masters), the controller manager, the scheduler and,
// a kubeconfig for each client. --host adds an address the serving certificate is valid
// for (the `kubernetes` Service's ClusterIP). With --node, later, it signs with that CA
// a kubelet's client certificate (system:node:NAME in system:nodes, as the Node
// authorizer and NodeRestriction expect) into node-NAME.kubeconfig.
//
//	gen-pki --dir DIR --server https://127.0.0.1:PORT [--host IP]...
//	gen-pki --dir DIR --server https://127.0.0.1:PORT --node NAME
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

type keyPair struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

func newKey() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		fail("generating a key: %v", err)
	}
	return k
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		fail("generating a serial number: %v", err)
	}
	return n
}

func sign(template *x509.Certificate, parent *keyPair, key *ecdsa.PrivateKey) *keyPair {
	signer, parentCert := key, template
	if parent != nil {
		signer, parentCert = parent.key, parent.cert
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parentCert, &key.PublicKey, signer)
	if err != nil {
		fail("signing %s: %v", template.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		fail("reading back %s: %v", template.Subject.CommonName, err)
	}
	return &keyPair{cert: cert, der: der, key: key}
}

func leaf(ca *keyPair, cn string, orgs []string, usage x509.ExtKeyUsage, hosts []string) *keyPair {
	t := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(10 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			t.IPAddresses = append(t.IPAddresses, ip)
		} else {
			t.DNSNames = append(t.DNSNames, h)
		}
	}
	return sign(t, ca, newKey())
}

func certPEM(p *keyPair) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.der})
}

func keyPEM(k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		fail("encoding a key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

func write(dir, name string, data []byte) {
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		fail("writing %s: %v", name, err)
	}
}

func kubeconfig(server string, ca, client *keyPair, user string) []byte {
	b64 := base64.StdEncoding.EncodeToString
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: test
  context:
    cluster: test
    user: %s
current-context: test
`, server, b64(certPEM(ca)), user, b64(certPEM(client)), b64(keyPEM(client.key)), user))
}

// readCA loads the CA that an earlier run wrote to dir.
func readCA(dir string) *keyPair {
	certPEMBytes, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		fail("reading the CA: %v", err)
	}
	keyPEMBytes, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		fail("reading the CA's key: %v", err)
	}
	cb, _ := pem.Decode(certPEMBytes)
	kb, _ := pem.Decode(keyPEMBytes)
	if cb == nil || kb == nil {
		fail("%s holds no PEM CA certificate and key", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		fail("parsing the CA certificate: %v", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		fail("parsing the CA key: %v", err)
	}
	return &keyPair{cert: cert, der: cb.Bytes, key: key}
}

// hostList is a repeatable --host flag.
type hostList []string

func (h *hostList) String() string { return fmt.Sprint(*h) }

func (h *hostList) Set(v string) error {
	if net.ParseIP(v) == nil {
		return fmt.Errorf("%q is not an IP address", v)
	}
	*h = append(*h, v)
	return nil
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "gen-pki: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	dir := flag.String("dir", "", "directory to write into (created)")
	server := flag.String("server", "", "the API server's URL, e.g. https://127.0.0.1:6443")
	node := flag.String("node", "", "a node whose kubelet gets node-NAME.kubeconfig, signed by DIR's CA")
	var hosts hostList
	flag.Var(&hosts, "host", "an address the serving certificate is valid for (repeatable)")
	flag.Parse()
	if *dir == "" || *server == "" {
		fail("usage: gen-pki --dir DIR --server https://127.0.0.1:PORT")
	}
	if *node != "" {
		ca := readCA(*dir)
		client := leaf(ca, "system:node:"+*node, []string{"system:nodes"}, x509.ExtKeyUsageClientAuth, nil)
		write(*dir, "node-"+*node+".kubeconfig", kubeconfig(*server, ca, client, "system:node:"+*node))
		return
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		fail("creating %s: %v", *dir, err)
	}
	caKey := newKey()
	ca := sign(&x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "gpushare-bench test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}, nil, caKey)
	write(*dir, "ca.crt", certPEM(ca))
	write(*dir, "ca.key", keyPEM(ca.key))

	serving := leaf(ca, "kube-apiserver", nil, x509.ExtKeyUsageServerAuth, append([]string{
		"127.0.0.1", "localhost", "kubernetes", "kubernetes.default",
		"kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
	}, hosts...))
	write(*dir, "apiserver.crt", certPEM(serving))
	write(*dir, "apiserver.key", keyPEM(serving.key))

	sa := newKey()
	write(*dir, "sa.key", keyPEM(sa))
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		fail("encoding the service-account key: %v", err)
	}
	write(*dir, "sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))

	for _, c := range []struct{ file, cn, org string }{
		{"admin", "gpushare-test-admin", "system:masters"},
		{"controller-manager", "system:kube-controller-manager", ""},
		{"scheduler", "system:kube-scheduler", ""},
	} {
		var orgs []string
		if c.org != "" {
			orgs = []string{c.org}
		}
		client := leaf(ca, c.cn, orgs, x509.ExtKeyUsageClientAuth, nil)
		write(*dir, c.file+".kubeconfig", kubeconfig(*server, ca, client, c.cn))
	}
}
