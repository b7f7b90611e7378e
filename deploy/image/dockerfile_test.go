package image_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/deploy/image"
)

// instruction is one Dockerfile instruction: its keyword and the rest of
// its line, continuation lines joined.
type instruction struct {
	cmd  string
	args string
}

// parseDockerfile splits a Dockerfile into its stages' instructions.
func parseDockerfile(t *testing.T, data string) [][]instruction {
	t.Helper()
	var stages [][]instruction
	var line string
	for l := range strings.Lines(data) {
		l = strings.TrimRight(l, "\n")
		if strings.HasPrefix(strings.TrimSpace(l), "#") && line == "" {
			continue
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			line += s
			continue
		}
		line += l
		if strings.TrimSpace(line) == "" {
			line = ""
			continue
		}
		cmd, args, _ := strings.Cut(strings.TrimSpace(line), " ")
		line = ""
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("Dockerfile: %s before FROM", in.cmd)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	return stages
}

// dockerfileFile is what one COPY of the final stage puts in the image.
type dockerfileFile struct {
	Path, Source string
	Mode         string
}

// TestDockerfile checks that deploy/Dockerfile describes make image's
// linux/amd64 image: its final stage starts from nothing and copies exactly the
// image's files to the same paths with the same modes, from the Debian
// paths make image takes them from; entrypoint, user, environment and
// labels are the image's; its build stage builds the binary as make
// image does.
func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t, string(readFile(t, filepath.Join(repoRoot, "deploy/Dockerfile"))))
	if len(stages) != 2 {
		t.Fatalf("Dockerfile has %d stages, want 2 (build, image)", len(stages))
	}
	build, final := stages[0], stages[1]
	if final[0].args != "scratch" {
		t.Errorf("the image stage is FROM %s, want scratch (no shell, nothing but nri-gpu and glibc)", final[0].args)
	}
	args := map[string]string{}
	var got struct {
		Files      []dockerfileFile
		Entrypoint []string
		Env        []string
		User       string
		Labels     map[string]string
	}
	got.Labels = map[string]string{}
	expand := func(s string) string {
		return regexp.MustCompile(`\$\{(\w+)\}`).ReplaceAllStringFunc(s, func(m string) string { return args[m[2:len(m)-1]] })
	}
	var other []string
	for _, in := range final[1:] {
		switch in.cmd {
		case "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			args[k] = v
		case "COPY":
			f := strings.Fields(in.args)
			mode, from := "", ""
			for len(f) > 2 && strings.HasPrefix(f[0], "--") {
				if v, ok := strings.CutPrefix(f[0], "--chmod="); ok {
					mode = v
				}
				if v, ok := strings.CutPrefix(f[0], "--from="); ok {
					from = v
				}
				f = f[1:]
			}
			if len(f) != 2 || from != "build" {
				t.Errorf("COPY %s: want one file from the build stage", in.args)
				continue
			}
			if mode == "" {
				mode = "0755" // the loader's and go build's output's mode in the build stage
			}
			got.Files = append(got.Files, dockerfileFile{Path: f[1], Source: f[0], Mode: mode})
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &got.Entrypoint); err != nil {
				t.Errorf("ENTRYPOINT %s: want the exec form: %v", in.args, err)
			}
		case "ENV":
			got.Env = append(got.Env, in.args)
		case "USER":
			got.User = in.args
		case "LABEL":
			for _, m := range regexp.MustCompile(`([\w.-]+)="([^"]*)"`).FindAllStringSubmatch(in.args, -1) {
				got.Labels[m[1]] = expand(m[2])
			}
		default:
			other = append(other, in.cmd+" "+in.args)
		}
	}
	if len(other) > 0 {
		t.Errorf("the image stage has instructions make image knows nothing of: %q", other)
	}

	m := testImage(t)
	amd64, err := image.PlatformOf("amd64")
	if err != nil {
		t.Fatal(err)
	}
	files, _, err := image.Files(amd64, m.binary("amd64"), "/")
	if err != nil {
		t.Fatal(err)
	}
	var wantFiles []dockerfileFile
	for _, f := range files {
		src := f.Source
		if f.Path == image.BinaryPath {
			src = "/out/nri-gpu"
		}
		wantFiles = append(wantFiles, dockerfileFile{Path: f.Path, Source: src, Mode: "0" + strconv.FormatUint(uint64(f.Mode.Perm()), 8)})
	}
	slices.SortFunc(got.Files, func(a, b dockerfileFile) int { return strings.Compare(a.Path, b.Path) })
	want := got
	want.Files = wantFiles
	want.Entrypoint = image.Entrypoint
	want.Env = image.Env
	want.User = image.User
	want.Labels = image.Labels(args["VERSION"])
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Dockerfile's image stage and make image (-make image +Dockerfile):\n%s", d)
	}

	// The build stage builds what make image builds for amd64.
	dry, err := exec.Command("make", "-n", "--no-print-directory", "-C", repoRoot, "image").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, dry)
	}
	makeBuild := find(t, "make -n image: the amd64 go build", `(?m)^(CGO_ENABLED=0 GOARCH=amd64 \S+ build .*)$`, dry)
	makeBuild = regexp.MustCompile(`-X main\.Version=\S+?"`).ReplaceAllLiteralString(makeBuild, `-X main.Version=${VERSION}"`)
	makeBuild = regexp.MustCompile(` -o \S+`).ReplaceAllLiteralString(makeBuild, " -o /out/nri-gpu")
	var runs []string
	for _, in := range build {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			runs = append(runs, in.args)
		}
	}
	if d := cmp.Diff([]string{makeBuild}, runs); d != "" {
		t.Errorf("the build stage's go build and make image's (-make +Dockerfile):\n%s", d)
	}
	if !strings.HasSuffix(build[0].args, "-bookworm AS build") {
		t.Errorf("build stage FROM %s: want a Debian 12 (bookworm) image, whose libc6 is the one make image's documentation names", build[0].args)
	}
}
