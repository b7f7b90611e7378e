package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is a cluster's certificate authority and the files it signed, all in
// one directory: the CA (ca.crt, ca.key), and a key and certificate per
// name (name.crt, name.key).
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

// certSpec is a certificate to issue: the subject (CN and O, as the API
// server's x509 authenticator reads user and groups), whether it serves
// or authenticates a client, and the serving names.
type certSpec struct {
	name   string // file name
	cn     string
	orgs   []string
	server bool
	client bool
	dns    []string
	ips    []string
}

// newPKI makes a CA in dir.
func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "nri-gpu-e2e-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, caCert: cert, caKey: key}
	if err := p.write("ca", der, key); err != nil {
		return nil, err
	}
	return p, nil
}

// path is the file of name with its extension ("admin", ".crt").
func (p *pki) path(name, ext string) string { return filepath.Join(p.dir, name+ext) }

// issue signs a certificate for s with the CA and writes it and its key.
func (p *pki) issue(s certSpec) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: s.cn, Organization: s.orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		DNSNames:     s.dns,
	}
	if s.server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if s.client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, ip := range s.ips {
		parsed := net.ParseIP(ip)
		if parsed == nil {
			return fmt.Errorf("certificate %s: bad IP %q", s.name, ip)
		}
		tmpl.IPAddresses = append(tmpl.IPAddresses, parsed)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return fmt.Errorf("sign certificate %s: %w", s.name, err)
	}
	return p.write(s.name, der, key)
}

// write writes name.crt and name.key.
func (p *pki) write(name string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.path(name, ".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(p.path(name, ".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
}

// serviceAccountKeys writes the RSA key pair that signs and verifies
// service account tokens (sa.key, sa.pub).
func (p *pki) serviceAccountKeys() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.path("sa", ".key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(p.path("sa", ".pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

// kubeconfig writes a kubeconfig for the client certificate name that
// talks to server, trusting the CA; it returns its path.
func (p *pki) kubeconfig(name, server string) (string, error) {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: nri-gpu-e2e
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: nri-gpu-e2e
  context:
    cluster: nri-gpu-e2e
    user: %s
current-context: nri-gpu-e2e
`, server, p.path("ca", ".crt"), name, p.path(name, ".crt"), p.path(name, ".key"), name)
	path := p.path(name, ".kubeconfig")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}
