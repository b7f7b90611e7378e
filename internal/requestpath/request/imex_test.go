package request

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// imexNode returns the channels of a node that has the given numbers.
func imexNode(nums ...int) []inventory.IMEXChannel {
	var out []inventory.IMEXChannel
	for _, n := range nums {
		out = append(out, inventory.IMEXChannel{Number: n, Node: inventory.DeviceNode{Path: inventory.IMEXChannelPath(n), Major: 500, Minor: int64(n), Mode: 0o666}})
	}
	return out
}

func imexMount(id string) inventory.Mount {
	return inventory.Mount{Source: "/dev/null", Destination: DeviceListIMEX + "/" + id}
}

func TestParseIMEX(t *testing.T) {
	ann := func(v string) map[string]string { return map[string]string{AnnotationContainerPrefix + "c": v} }
	annSrc := Source{ContainerAnnotation, AnnotationContainerPrefix + "c"}
	envSrc := Source{Env, EnvIMEXChannels}
	mntSrc := Source{DeviceList, DeviceListIMEX}
	for _, tc := range []struct {
		name string
		in   Input
		want IMEXRequest
		err  string
	}{
		{name: "nothing", in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}},
		{name: "env list", in: Input{Env: []string{EnvIMEXChannels + "= 1, 0 ,,1"}},
			want: IMEXRequest{Source: envSrc, Channels: []int{1, 0}, Tokens: []string{"1", "0"}}},
		{name: "env channelN", in: Input{Env: []string{EnvIMEXChannels + "=channel3"}},
			want: IMEXRequest{Source: envSrc, Channels: []int{3}, Tokens: []string{"channel3"}}},
		{name: "env all", in: Input{Env: []string{EnvIMEXChannels + "=all"}}, want: IMEXRequest{Source: envSrc, All: true}},
		{name: "env all in a list", in: Input{Env: []string{EnvIMEXChannels + "=0,all"}}, want: IMEXRequest{Source: envSrc, All: true}},
		{name: "env void", in: Input{Env: []string{EnvIMEXChannels + "=0,void"}}},
		{name: "env none", in: Input{Env: []string{EnvIMEXChannels + "=none"}}},
		{name: "env empty", in: Input{Env: []string{EnvIMEXChannels + "= , "}}},
		{name: "env first entry wins", in: Input{Env: []string{EnvIMEXChannels + "=2", EnvIMEXChannels + "=3"}},
			want: IMEXRequest{Source: envSrc, Channels: []int{2}, Tokens: []string{"2"}}},
		{name: "env bad token", in: Input{Env: []string{EnvIMEXChannels + "=0,x1"}},
			err: `nri-gpu: env NVIDIA_IMEX_CHANNELS: bad IMEX channel "x1" (valid: all, or channel numbers 0 to 1048575 (N or channelN))`},
		{name: "env leading zero", in: Input{Env: []string{EnvIMEXChannels + "=01"}}, err: `bad IMEX channel "01"`},
		{name: "env too large", in: Input{Env: []string{EnvIMEXChannels + "=1048576"}}, err: `bad IMEX channel "1048576"`},
		{name: "env negative", in: Input{Env: []string{EnvIMEXChannels + "=-1"}}, err: `bad IMEX channel "-1"`},
		{name: "mounts before env", in: Input{Mounts: []inventory.Mount{imexMount("1"), imexMount("1"), {Source: "/dev/null", Destination: DeviceListRoot + "/0"}},
			Env: []string{EnvIMEXChannels + "=all"}}, want: IMEXRequest{Source: mntSrc, Channels: []int{1}, Tokens: []string{"1"}}},
		{name: "mount not of /dev/null", in: Input{Mounts: []inventory.Mount{{Source: "/tmp", Destination: DeviceListIMEX + "/1"}}}},
		{name: "mount cleaned", in: Input{Mounts: []inventory.Mount{{Source: "/dev//null", Destination: DeviceListRoot + "/./imex/2/"}}},
			want: IMEXRequest{Source: mntSrc, Channels: []int{2}, Tokens: []string{"2"}}},
		{name: "mount void is a bad channel", in: Input{Mounts: []inventory.Mount{imexMount("void")}},
			err: `nri-gpu: mounts /var/run/nvidia-container-devices/imex: bad IMEX channel "void"`},
		{name: "annotation field", in: Input{Name: "c", Annotations: ann(`1,"imex-channels=0,1"`), Env: []string{EnvIMEXChannels + "=5"}},
			want: IMEXRequest{Source: annSrc, Channels: []int{0, 1}, Tokens: []string{"0", "1"}}},
		{name: "annotation all", in: Input{Name: "c", Annotations: ann("imex-channels=all")}, want: IMEXRequest{Source: annSrc, All: true}},
		{name: "annotation without the field: the next carrier", in: Input{Name: "c", Annotations: ann("1"), Env: []string{EnvIMEXChannels + "=5"}},
			want: IMEXRequest{Source: envSrc, Channels: []int{5}, Tokens: []string{"5"}}},
		{name: "annotation void", in: Input{Name: "c", Annotations: ann("imex-channels=void")}, err: `bad IMEX channel "void"`},
		{name: "annotation empty channel", in: Input{Name: "c", Annotations: ann(`"imex-channels=0,"`)}, err: `empty channel in field imex-channels="0,"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := FindIMEX(tc.in)
			var r IMEXRequest
			if err == nil {
				r, err = f.Parse()
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r, tc.want) {
				t.Errorf("got %+v, want %+v", r, tc.want)
			}
		})
	}
}

// TestAnnotationIMEXField: the annotation's grammar takes the
// imex-channels field beside a GPU request, or alone (no GPU), and
// refuses a bad one with the rest of the value.
func TestAnnotationIMEXField(t *testing.T) {
	src := Source{ContainerAnnotation, AnnotationContainerPrefix + "c"}
	r, err := parseAnnotation(src, `count=2,"imex-channels=0,1"`, envValue{})
	if err != nil || r.Kind != Count || r.Count != 2 {
		t.Errorf("count with channels: %+v, %v", r, err)
	}
	r, err = parseAnnotation(src, "imex-channels=1", envValue{})
	if err != nil || r.Kind != Nothing || r.Source != src {
		t.Errorf("channels alone: %+v, %v", r, err)
	}
	_, err = parseAnnotation(src, "1,imex-channels=0,1", envValue{})
	if err == nil || !strings.Contains(err.Error(), `quote a channel list that has commas, as in '"imex-channels=0,1"'`) {
		t.Errorf("unquoted list: %v", err)
	}
	_, err = parseAnnotation(src, "1,imex-channels=x", envValue{})
	if err == nil || !strings.Contains(err.Error(), `annotation gpus.nri-gpu.dev/container.c: bad IMEX channel "x"`) {
		t.Errorf("bad channel: %v", err)
	}
	_, err = parseAnnotation(src, "1,imex-channels=0,imex-channels=1", envValue{})
	if err == nil || !strings.Contains(err.Error(), "conflicts with an earlier field") {
		t.Errorf("repeated field: %v", err)
	}
}

func TestSelectIMEX(t *testing.T) {
	node := imexNode(0, 1, 2, 5)
	src := Source{Env, EnvIMEXChannels}
	got, err := SelectIMEX(IMEXRequest{Source: src, Channels: []int{5, 1}, Tokens: []string{"5", "channel1"}}, node)
	if err != nil || len(got) != 2 || got[0].Number != 5 || got[1].Number != 1 {
		t.Errorf("named: %+v, %v", got, err)
	}
	got, err = SelectIMEX(IMEXRequest{Source: src, All: true}, node)
	if err != nil || !reflect.DeepEqual(got, node) {
		t.Errorf("all: %+v, %v", got, err)
	}
	_, err = SelectIMEX(IMEXRequest{Source: src, Channels: []int{1, 3}, Tokens: []string{"1", "channel3"}}, node)
	if err == nil || err.Error() != `nri-gpu: env NVIDIA_IMEX_CHANNELS: unknown IMEX channel "channel3" (node has 0-2,5)` {
		t.Errorf("missing channel: %v", err)
	}
	_, err = SelectIMEX(IMEXRequest{Source: Source{DeviceList, DeviceListIMEX}, All: true}, nil)
	if err == nil || !strings.Contains(err.Error(), "mounts /var/run/nvidia-container-devices/imex: all IMEX channels requested, but the node has none") {
		t.Errorf("all on a node without channels: %v", err)
	}
	_, err = SelectIMEX(IMEXRequest{Source: src, Channels: []int{0}, Tokens: []string{"0"}}, nil)
	if err == nil || !strings.Contains(err.Error(), `unknown IMEX channel "0" (node has none)`) {
		t.Errorf("channel on a node without channels: %v", err)
	}
	if got, err := SelectIMEX(IMEXRequest{}, node); got != nil || err != nil {
		t.Errorf("no request: %+v, %v", got, err)
	}
}

// FuzzParseIMEX fuzzes NVIDIA_IMEX_CHANNELS, an imex/ mount entry and the
// annotation's field: an error in the package's form, or channels of the
// node, each once, no more than asked.
func FuzzParseIMEX(f *testing.F) {
	for _, s := range [][3]string{
		{"0,1", "", ""}, {"all", "", ""}, {"void", "", ""}, {"channel1, 2", "", ""}, {"01", "", ""},
		{"", "1", ""}, {"", "imex/all", ""}, {"", "", `1,"imex-channels=0,1"`}, {"", "", "imex-channels=all"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, env, mount, ann string) {
		in := Input{Name: "c", Env: []string{EnvIMEXChannels + "=" + env}}
		if mount != "" {
			in.Mounts = []inventory.Mount{imexMount(mount)}
		}
		if ann != "" {
			in.Annotations = map[string]string{AnnotationPod: ann}
		}
		node := imexNode(0, 1, 2)
		found, err := FindIMEX(in)
		var r IMEXRequest
		if err == nil {
			r, err = found.Parse()
		}
		var got []inventory.IMEXChannel
		if err == nil {
			got, err = SelectIMEX(r, node)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "nri-gpu: ") {
				t.Fatalf("error %q lacks the nri-gpu: prefix", err)
			}
			return
		}
		if !r.All && len(got) > len(r.Channels) || len(got) > len(node) {
			t.Fatalf("%d channels for %+v", len(got), r)
		}
		seen := map[int]bool{}
		for _, c := range got {
			if seen[c.Number] {
				t.Fatalf("channel %d twice", c.Number)
			}
			seen[c.Number] = true
		}
	})
}

// TestIMEXBounds: a request names at most 2048 channels, and
// NVIDIA_IMEX_CHANNELS is at most 16 KiB; over a bound is an error naming
// the carrier, never a request cut short.
func TestIMEXBounds(t *testing.T) {
	parse := func(in Input) error {
		f, err := FindIMEX(in)
		if err == nil {
			_, err = f.Parse()
		}
		return err
	}
	if err := parse(Input{Env: []string{EnvIMEXChannels + "=" + strings.Repeat("0,", 2049)}}); err == nil ||
		err.Error() != "nri-gpu: env NVIDIA_IMEX_CHANNELS: more than 2048 channels" {
		t.Errorf("2049 entries: %v", err)
	}
	if err := parse(Input{Env: []string{EnvIMEXChannels + "=" + strings.Repeat(" ", 16<<10+1)}}); err == nil ||
		!strings.Contains(err.Error(), "value is 16385 bytes long (at most 16384)") {
		t.Errorf("17 KiB: %v", err)
	}
	var mounts []inventory.Mount
	for i := 0; i <= 2048; i++ {
		mounts = append(mounts, imexMount(strconv.Itoa(i)))
	}
	if err := parse(Input{Mounts: mounts}); err == nil || err.Error() != "nri-gpu: mounts /var/run/nvidia-container-devices/imex: more than 2048 channels" {
		t.Errorf("2049 mounts: %v", err)
	}
	if err := parse(Input{Mounts: mounts[:2048]}); err != nil {
		t.Errorf("2048 mounts: %v", err)
	}
}
